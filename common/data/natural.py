"""Natural partition: one client per natural id (FEMNIST writer, HAR subject), small ids dropped."""

from __future__ import annotations

import numpy as np

from common.data.arrays import DataError


def natural_order(ids: np.ndarray, min_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """The ids holding at least `min_samples` samples, largest first (ties by id), and their sample counts."""
    values, counts = np.unique(ids, return_counts=True)
    keep = counts >= min_samples
    values, counts = values[keep], counts[keep]
    order = np.lexsort((values, -counts))
    return values[order], counts[order]


def natural_partition(
    ids: np.ndarray, num_clients: int, min_samples: int, kind: str = "id", dataset: str = "the data set"
) -> list[np.ndarray]:
    """Client k holds every sample of the k-th largest id with at least `min_samples` samples (ties: smaller id
    first); a run with fewer clients than such ids takes the largest; more clients than ids is a DataError."""
    if num_clients < 1:
        raise DataError(f"need at least one client, got {num_clients}")
    kept, _ = natural_order(ids, min_samples)
    if num_clients > len(kept):
        total = len(np.unique(ids))
        raise DataError(
            f"partition 'natural': {dataset} has {len(kept)} {kind}s with at least {min_samples} "
            f"samples (natural-min-samples; {total - len(kept)} of {total} dropped), the run has "
            f"{num_clients} clients: use at most {len(kept)} (num-supernodes)"
        )
    return [np.flatnonzero(ids == value).astype(np.int64) for value in kept[:num_clients]]
