"""Split sample labels across clients (IID, Dirichlet, pathological, LS/QS/LSQS, grouped); 75/25 train/test, or
FedAMP's exact per-client train and test counts (grouped-exact)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np

from common.data.datasets import DataError


def _from_flwr_partitioner(partitioner, labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """Run a flwr-datasets partitioner over a label column; read back each partition's sample indices."""
    from datasets import Dataset
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    partitioner.dataset = Dataset.from_dict({"label": labels.astype(np.int64), "index": np.arange(len(labels))})
    return [
        partitioner.load_partition(c).with_format("arrow")["index"].to_numpy().astype(np.int64)
        for c in range(num_clients)
    ]


def iid(labels: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    """Equal-size random shards (flwr-datasets IidPartitioner over a seeded permutation)."""
    # IidPartitioner cuts contiguous shards; shuffle first so shards are random.
    order = np.random.default_rng(seed).permutation(len(labels))
    try:
        from flwr_datasets.partitioner import IidPartitioner
    except ImportError:  # a device's base install: the same contiguous shards (the first len % n one longer)
        return [order[shard] for shard in np.array_split(np.arange(len(labels)), num_clients)]
    parts = _from_flwr_partitioner(IidPartitioner(num_partitions=num_clients), labels[order], num_clients)
    return [order[p] for p in parts]


def dirichlet(
    labels: np.ndarray, num_clients: int, alpha: float, seed: int, min_size: int | None = None
) -> list[np.ndarray]:
    """Label + quantity skew: per class, a Dir(alpha) vector over clients splits that class's samples.

    One draw, never a retry: the draws and cuts are flwr-datasets' DirichletPartitioner's (same seed, same
    partitions whenever its first draw meets the minimum); a client left below `min_size` samples is then topped
    up, one sample at a time, from the largest client, in the class it drew the largest share of that the donor
    holds. So every client count the data can feed (2 samples each) succeeds, in milliseconds.
    """
    if alpha <= 0:
        raise DataError(f"dirichlet partition needs dirichlet-alpha > 0, got {alpha}")
    if min_size is None:
        min_size = max(2, min(10, len(labels) // (4 * num_clients)))
    if num_clients * min_size > len(labels):
        raise DataError(
            f"dirichlet partition: {num_clients} clients x {min_size} samples is more than the "
            f"{len(labels)} samples; use at most {len(labels) // min_size} clients"
        )
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    shares = np.empty((len(classes), num_clients))
    chunks: list[list[np.ndarray]] = []  # chunks[c][k]: class c's samples for client k
    for c, label in enumerate(classes):
        idx = np.flatnonzero(labels == label)
        shares[c] = rng.dirichlet(np.full(num_clients, float(alpha)))
        chunks.append(np.split(idx, (np.cumsum(shares[c]) * len(idx)).astype(int)[:-1]))
    counts = np.array([[len(chunks[c][k]) for c in range(len(classes))] for k in range(num_clients)])
    for donor, recipient, c in _top_up(counts, shares.T, min_size):
        chunks[c][recipient] = np.append(chunks[c][recipient], chunks[c][donor][-1])
        chunks[c][donor] = chunks[c][donor][:-1]
    out = []
    for k in range(num_clients):
        indices = np.concatenate([chunks[c][k] for c in range(len(classes))]).astype(np.int64)
        rng.shuffle(indices)
        out.append(indices)
    return out


def _top_up(counts: np.ndarray, preference: np.ndarray, min_size: int) -> list[tuple[int, int, int]]:
    """Single-sample moves (donor, recipient, class) that lift every client to `min_size`: from the largest client,
    in the class the recipient prefers most among those the donor holds. Needs counts.sum() >= rows x min_size."""
    counts = counts.copy()
    sizes = counts.sum(axis=1)
    moves = []
    for k in np.flatnonzero(sizes < min_size):
        while sizes[k] < min_size:
            donor = int(np.argmax(sizes))
            c = int(np.argmax(np.where(counts[donor] > 0, preference[k], -1.0)))
            counts[donor, c] -= 1
            counts[k, c] += 1
            sizes[donor] -= 1
            sizes[k] += 1
            moves.append((donor, int(k), c))
    return moves


def pathological(
    labels: np.ndarray, num_clients: int, seed: int, classes_per_client: int = 2, big_fraction: float = 0.1
) -> list[np.ndarray]:
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


# Dirichlet draws with a small alpha underflow to exact zeros; a tiny floor keeps the matrix positive,
# so Sinkhorn-Knopp always converges, without visibly changing the skew.
_DIRICHLET_FLOOR = 1e-12


def sinkhorn_knopp(
    matrix: np.ndarray,
    row_sums: np.ndarray,
    col_sums: np.ndarray,
    tol: float = 1e-9,
    max_iter: int = 10_000,
    best_effort: bool = False,
) -> np.ndarray:
    """Alternately scale the rows and columns of a positive matrix until its margins match the targets.

    After `max_iter` rounds it raises, or with `best_effort` returns the last matrix: its columns match exactly and
    its rows approximately (enough for a caller that rounds to integer margins afterwards)."""
    out = np.array(matrix, dtype=np.float64)
    rows = np.asarray(row_sums, dtype=np.float64)
    cols = np.asarray(col_sums, dtype=np.float64)
    if out.ndim != 2 or out.shape != (len(rows), len(cols)):
        raise DataError(
            f"sinkhorn_knopp: matrix shape {out.shape} does not match {len(rows)} row and {len(cols)} column targets"
        )
    if not np.all(np.isfinite(out)) or np.any(out < 0) or np.any(rows <= 0) or np.any(cols <= 0):
        raise DataError("sinkhorn_knopp needs a finite non-negative matrix and positive targets")
    if not np.isclose(rows.sum(), cols.sum(), rtol=1e-9, atol=0.0):
        raise DataError(f"sinkhorn_knopp: row targets sum to {rows.sum()} but column targets to {cols.sum()}")
    if np.any(out.sum(axis=1) == 0) or np.any(out.sum(axis=0) == 0):
        raise DataError("sinkhorn_knopp: a row or column of the matrix is all zero and cannot be scaled")
    for iteration in range(max_iter):
        out *= cols / out.sum(axis=0)
        current = out.sum(axis=1)
        if np.max(np.abs(current - rows) / rows) <= tol:
            return out
        if best_effort and iteration == max_iter - 1:
            return out
        out *= (rows / current)[:, None]
    raise DataError(
        f"sinkhorn_knopp did not reach the row/column targets within {max_iter} iterations; use a larger alpha"
    )


def _largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Non-negative integers proportional to `weights` that sum exactly to `total`."""
    exact = np.asarray(weights, dtype=np.float64) / np.sum(weights) * total
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: total - counts.sum()]] += 1
    return counts


def _round_to_margins(real: np.ndarray, row_totals: np.ndarray, col_totals: np.ndarray) -> np.ndarray:
    """Integer (clients x classes) counts near `real` whose row and column sums are exactly the totals."""
    if int(np.sum(row_totals)) != int(np.sum(col_totals)):
        raise DataError(f"client sizes sum to {np.sum(row_totals)} but class sizes to {np.sum(col_totals)}")
    counts = np.stack([_largest_remainder(real[:, c], int(col_totals[c])) for c in range(real.shape[1])], axis=1)
    surplus = counts.sum(axis=1) - row_totals
    # Column rounding leaves rows a few samples off; move single samples from the fullest row to the
    # emptiest, in the class where that costs the least rounding error. Column sums stay exact.
    while surplus.any():
        src, dst = int(np.argmax(surplus)), int(np.argmin(surplus))
        gain = (counts[src] - real[src]) - (counts[dst] - real[dst])
        gain[counts[src] == 0] = -np.inf
        c = int(np.argmax(gain))
        counts[src, c] -= 1
        counts[dst, c] += 1
        surplus[src] -= 1
        surplus[dst] += 1
    return counts


def _assign(labels: np.ndarray, classes: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Deal counts[k, c] random samples of class c to client k; no sample goes to two clients."""
    parts: list[list[np.ndarray]] = [[] for _ in range(counts.shape[0])]
    for c, label in enumerate(classes):
        idx = rng.permutation(np.flatnonzero(labels == label))[: counts[:, c].sum()]
        for k, chunk in enumerate(np.split(idx, np.cumsum(counts[:, c])[:-1])):
            parts[k].append(chunk)
    return [rng.permutation(np.concatenate(p)).astype(np.int64) for p in parts]


def _classes_and_sizes(
    labels: np.ndarray, num_clients: int, alpha: float, scheme: str
) -> tuple[np.ndarray, np.ndarray]:
    """The distinct labels and their sample counts, after checking alpha and the client count."""
    if alpha <= 0:
        raise DataError(f"{scheme} partition needs alpha > 0, got {alpha}")
    if len(labels) < 2 * num_clients:
        raise DataError(f"{scheme}: {num_clients} clients for {len(labels)} samples: each client needs at least 2")
    return np.unique(labels, return_counts=True)


def _dirichlet_sizes(rng: np.random.Generator, total: int, num_clients: int, alpha: float) -> np.ndarray:
    """Client sizes: 2 each, the rest split by a Dir(alpha) draw over clients."""
    share = rng.dirichlet([alpha] * num_clients)
    return 2 + _largest_remainder(np.maximum(share, _DIRICHLET_FLOOR), total - 2 * num_clients)


def _skewed_split(
    labels: np.ndarray, num_clients: int, alpha: float, seed: int, scheme: str, label_skew: bool, quantity_skew: bool
) -> list[np.ndarray]:
    classes, class_sizes = _classes_and_sizes(labels, num_clients, alpha, scheme)
    rng = np.random.default_rng(seed)
    total = len(labels)
    if quantity_skew:
        sizes = _dirichlet_sizes(rng, total, num_clients, alpha)
    else:
        sizes = _largest_remainder(np.ones(num_clients), total)
    if label_skew:
        rows = np.maximum(rng.dirichlet([alpha] * len(classes), size=num_clients), _DIRICHLET_FLOOR)
        # Slow convergence (alpha near 0) must not fail a valid request: the rounding below makes the margins exact.
        real = sinkhorn_knopp(rows, sizes.astype(np.float64), class_sizes.astype(np.float64), best_effort=True)
    else:
        real = np.outer(sizes, class_sizes) / total
    return _assign(labels, classes, _round_to_margins(real, sizes, class_sizes), rng)


def label_skew_ls(labels: np.ndarray, num_clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    """FLIU LS: Dir(alpha) class rows, Sinkhorn-balanced so all samples are used and client sizes are equal.

    Sinkhorn-Knopp runs on the count margins (column c sums to the size of class c, every row to
    n / K); with equal class sizes this is FLIU's LS matrix (FLIU [arXiv:2510.24503]
    Sec. IV-A3: columns 1, rows L / K) times the class size.
    Counts are rounded per class by largest remainder, then single samples are moved between
    clients so that client sizes differ by at most 1.
    """
    return _skewed_split(labels, num_clients, alpha, seed, "ls", label_skew=True, quantity_skew=False)


def quantity_skew_qs(labels: np.ndarray, num_clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    """FLIU QS: client sizes from Dir(alpha) over clients (at least 2 each), each class split in proportion."""
    return _skewed_split(labels, num_clients, alpha, seed, "qs", label_skew=False, quantity_skew=True)


def lsqs(labels: np.ndarray, num_clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    """FLIU LSQS: Dir(alpha) client sizes and Dir(alpha) class rows, Sinkhorn-fitted to both; all samples used."""
    return _skewed_split(labels, num_clients, alpha, seed, "lsqs", label_skew=True, quantity_skew=True)


def _grouped_counts(groups: np.ndarray, sizes: np.ndarray, num_classes: int, dominant_share: float) -> np.ndarray:
    """(clients x classes) counts: dominant_share of each client on its group's two classes, the rest even."""
    counts = np.zeros((len(groups), num_classes), dtype=np.int64)
    for k, (g, size) in enumerate(zip(groups, sizes)):
        first, second = (2 * g) % num_classes, (2 * g + 1) % num_classes
        n_dom = int(np.floor(dominant_share * size + 0.5))
        counts[k, first], counts[k, second] = n_dom - n_dom // 2, n_dom // 2
        others = [c for c in range(num_classes) if c not in (first, second)]
        base, extra = divmod(int(size) - n_dom, len(others))
        counts[k, others] = base
        # The leftover samples rotate over the other classes with the client id, to keep classes even.
        counts[k, [others[(k + j) % len(others)] for j in range(extra)]] += 1
    return counts


def _grouped_setup(
    labels: np.ndarray,
    num_clients: int,
    num_groups: int,
    dominant_share: float,
    group_sizes: Sequence[int],
    scheme: str = "grouped",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct labels, their sample counts and every client's group, after checking the arguments."""
    classes, class_sizes = np.unique(labels, return_counts=True)
    if len(classes) < 3:
        raise DataError(f"{scheme} partition needs at least 3 classes, the labels have {len(classes)}")
    if len(group_sizes) != num_groups:
        raise DataError(f"{scheme} partition: {len(group_sizes)} group sizes for {num_groups} groups")
    if not 1 <= num_groups <= num_clients:
        raise DataError(f"{scheme} partition: {num_groups} groups need between 1 and {num_clients} clients")
    if not 0.0 <= dominant_share <= 1.0 or min(group_sizes) < 2:
        raise DataError(f"{scheme} partition needs 0 <= dominant-share <= 1 and at least 2 samples per client")
    return classes, class_sizes, np.arange(num_clients) * num_groups // num_clients


def grouped(
    labels: np.ndarray,
    num_clients: int,
    seed: int,
    num_groups: int = 5,
    dominant_share: float = 0.8,
    group_sizes: Sequence[int] = (500, 400, 300, 200, 100),
) -> list[np.ndarray]:
    """FedAMP's challenging non-IID split: client groups dominated by 2 classes each, group-specific sizes.

    Client k is in group k * num_groups // num_clients (contiguous, near-equal groups). A client of
    group g holds group_sizes[g] samples, round(dominant_share * size) from classes 2g and 2g + 1
    (mod L), the rest spread evenly over the other classes. When some class has too few samples,
    all sizes are scaled down by one factor (with a warning); below 10% of the asked sizes it is an
    error. Samples are drawn without replacement; not every sample is used.
    """
    classes, class_sizes, groups = _grouped_setup(labels, num_clients, num_groups, dominant_share, group_sizes)
    asked = np.asarray(group_sizes, dtype=np.float64)[groups]
    scale = 1.0
    counts = _grouped_counts(groups, asked.astype(np.int64), len(classes), dominant_share)
    while np.any(counts.sum(axis=0) > class_sizes):
        scale *= min(0.99, float(np.min(class_sizes / np.maximum(counts.sum(axis=0), 1))))
        if scale < 0.1 or np.any(np.floor(scale * asked) < 2):
            raise DataError(
                f"grouped partition: {len(labels)} samples cannot hold even 10% of group sizes "
                f"{tuple(group_sizes)} for {num_clients} clients (or would leave a client under 2 "
                "samples); use fewer clients or smaller group sizes"
            )
        counts = _grouped_counts(groups, np.floor(scale * asked).astype(np.int64), len(classes), dominant_share)
    if scale < 1.0:
        warnings.warn(
            f"grouped partition: too few samples for group sizes {tuple(group_sizes)}; "
            f"client sizes scaled by {scale:.3f}",
            UserWarning,
            stacklevel=2,
        )
    return _assign(labels, classes, counts, np.random.default_rng(seed))


def grouped_exact(
    labels: np.ndarray,
    num_clients: int,
    seed: int,
    test_size: int = 100,
    num_groups: int = 5,
    dominant_share: float = 0.8,
    group_sizes: Sequence[int] = (500, 400, 300, 200, 100),
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """FedAMP's grouped split as its paper states it: (train, test) indices of every client.

    A client of group g holds group_sizes[g] training samples and `test_size` test samples, each set with
    `grouped`'s class counts for its size (dominant_share on classes 2g and 2g + 1, the rest spread evenly),
    so the test set follows the client's training distribution. All sets are disjoint, drawn without
    replacement; sizes are never scaled: a class with too few samples is a DataError.
    """
    scheme = "grouped-exact"
    classes, class_sizes, groups = _grouped_setup(labels, num_clients, num_groups, dominant_share, group_sizes, scheme)
    if test_size < 1:
        raise DataError(f"{scheme} partition needs at least 1 test sample per client, got {test_size}")
    train_counts = _grouped_counts(
        groups, np.asarray(group_sizes, dtype=np.int64)[groups], len(classes), dominant_share
    )
    test_counts = _grouped_counts(groups, np.full(num_clients, test_size, dtype=np.int64), len(classes), dominant_share)
    needed = train_counts.sum(axis=0) + test_counts.sum(axis=0)
    short = np.flatnonzero(needed > class_sizes)
    if len(short):
        c = int(short[0])
        raise DataError(
            f"{scheme} partition: {num_clients} clients need {needed[c]} samples of class {classes[c]}, the data "
            f"has {class_sizes[c]}; use fewer clients, or partition 'grouped' (which scales the sizes down)"
        )
    # One deal over 2K rows (the K training sets, then the K test sets): no sample lands in two sets.
    parts = _assign(labels, classes, np.vstack([train_counts, test_counts]), np.random.default_rng(seed))
    return parts[:num_clients], parts[num_clients:]


def partition(
    labels: np.ndarray,
    scheme: str,
    num_clients: int,
    seed: int,
    alpha: float = 0.3,
    num_groups: int = 5,
    dominant_share: float = 0.8,
    group_sizes: Sequence[int] = (500, 400, 300, 200, 100),
) -> list[np.ndarray]:
    """Indices of each client's samples under the named scheme."""
    if num_clients < 1:
        raise DataError(f"need at least one client, got {num_clients}")
    if num_clients > len(labels) // 2:
        raise DataError(
            f"{num_clients} clients for {len(labels)} samples: each client needs at least 2; use at "
            f"most {len(labels) // 2} clients"
        )
    schemes: dict[str, Callable[[], list[np.ndarray]]] = {
        "iid": lambda: iid(labels, num_clients, seed),
        "dirichlet": lambda: dirichlet(labels, num_clients, alpha, seed),
        "pathological": lambda: pathological(labels, num_clients, seed),
        "ls": lambda: label_skew_ls(labels, num_clients, alpha, seed),
        "qs": lambda: quantity_skew_qs(labels, num_clients, alpha, seed),
        "lsqs": lambda: lsqs(labels, num_clients, alpha, seed),
        "grouped": lambda: grouped(labels, num_clients, seed, num_groups, dominant_share, group_sizes),
    }
    if scheme not in schemes:
        raise DataError(f"unknown label partition scheme '{scheme}' (label schemes: {', '.join(schemes)})")
    return schemes[scheme]()


def train_test_split(indices: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random split of one client's indices; at least one sample on each side when it has two."""
    order = np.random.default_rng(seed).permutation(indices)
    num_test = int(round(test_fraction * len(order)))
    if len(order) >= 2:
        num_test = min(max(num_test, 1), len(order) - 1)
    return order[num_test:], order[:num_test]
