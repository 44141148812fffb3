"""Split sample labels across clients (IID, Dirichlet, pathological) and each client 75/25 train/test."""

from __future__ import annotations

import warnings

import numpy as np

from .datasets import DataError


def _from_flwr_partitioner(partitioner, labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Run a flwr-datasets partitioner over a label column; read back each partition's sample indices."""
    from datasets import Dataset
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    partitioner.dataset = Dataset.from_dict({"label": labels.astype(np.int64), "index": np.arange(len(labels))})
    return [partitioner.load_partition(c).with_format("arrow")["index"].to_numpy().astype(np.int64) for c in range(num_clients)]


def iid(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    """Equal-size random shards (flwr-datasets IidPartitioner over a seeded permutation)."""
    from flwr_datasets.partitioner import IidPartitioner

    # IidPartitioner cuts contiguous shards; shuffle first so shards are random.
    order = np.random.default_rng(seed).permutation(len(labels))
    parts = _from_flwr_partitioner(IidPartitioner(num_partitions=num_clients), labels[order], num_clients)
    return [order[p] for p in parts]


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Label + quantity skew: per class, a Dir(alpha) vector over clients splits that class's samples."""
    from flwr_datasets.partitioner import DirichletPartitioner

    min_size = max(2, min(10, len(labels) // (4 * num_clients)))
    partitioner = DirichletPartitioner(num_partitions=num_clients, partition_by="label", alpha=alpha,
                                       min_partition_size=min_size, self_balancing=False, shuffle=True,
                                       seed=seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # its retry notices; a final failure raises below
            return _from_flwr_partitioner(partitioner, labels, num_clients)
    except ValueError as exc:
        raise DataError(f"dirichlet partition of {len(labels)} samples over {num_clients} clients with "
                        f"alpha={alpha} left a client with fewer than {min_size} samples in 10 tries; "
                        "use fewer clients or a larger dirichlet-alpha") from exc


def pathological(labels: np.ndarray, num_clients: int, seed: int, classes_per_client: int = 2,
                 big_fraction: float = 0.1) -> list[np.ndarray]:
    """Two classes per client; quantity skew: `big_fraction` of clients hold half of all samples.

    Client c holds classes c mod L and (c mod L + 1 + (c // L) mod (L - 1)) mod L, so every class is
    held by the same number of clients. Each client gets a weight (big clients 0.5 / n_big, the others
    0.5 / n_small, times a uniform factor in [0.5, 1.5]); each class is split among its holders in
    proportion to their weights.
    """
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    num_classes = len(classes)
    if classes_per_client != 2 or num_classes < 2:
        raise DataError("pathological partition needs 2 classes per client and at least 2 classes")
    holders: dict[int, list[int]] = {k: [] for k in range(num_classes)}
    for c in range(num_clients):
        first = c % num_classes
        second = (first + 1 + (c // num_classes) % (num_classes - 1)) % num_classes
        holders[first].append(c)
        holders[second].append(c)
    num_big = max(1, int(round(big_fraction * num_clients))) if num_clients > 1 else 0
    big = set(rng.permutation(num_clients)[:num_big].tolist())
    num_small = num_clients - len(big)
    weights = np.array([(0.5 / len(big)) if c in big else (0.5 / max(num_small, 1)) for c in range(num_clients)])
    weights *= rng.uniform(0.5, 1.5, size=num_clients)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for k, label in enumerate(classes):
        idx = rng.permutation(np.flatnonzero(labels == label))
        owners = holders[k]
        if not owners:
            continue  # more classes than client slots: this class goes unused
        share = weights[owners] / weights[owners].sum()
        cuts = (np.cumsum(share)[:-1] * len(idx)).astype(int)
        for owner, chunk in zip(owners, np.split(idx, cuts)):
            parts[owner].append(chunk)
    return [rng.permutation(np.concatenate(p)) if p else np.empty(0, np.int64) for p in parts]


def partition(labels: np.ndarray, scheme: str, num_clients: int, seed: int, alpha: float = 0.3) -> list[np.ndarray]:
    """Indices of each client's samples under the named scheme."""
    if num_clients < 1:
        raise DataError(f"need at least one client, got {num_clients}")
    if num_clients > len(labels) // 2:
        raise DataError(f"{num_clients} clients for {len(labels)} samples: each client needs at least 2")
    if scheme == "iid":
        return iid(labels, num_clients, seed)
    if scheme == "dirichlet":
        return dirichlet(labels, num_clients, alpha, seed)
    if scheme == "pathological":
        return pathological(labels, num_clients, seed)
    raise DataError(f"unknown partition scheme '{scheme}'")


def train_test_split(indices: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random split of one client's indices; at least one sample on each side when it has two."""
    order = np.random.default_rng(seed).permutation(indices)
    num_test = int(round(test_fraction * len(order)))
    if len(order) >= 2:
        num_test = min(max(num_test, 1), len(order) - 1)
    return order[num_test:], order[:num_test]
