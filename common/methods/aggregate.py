"""Aggregation math on plain numpy arrays."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

BLOCK = 1 << 15  # elements a blocked loop takes at a time: its float64 accumulators stay in the CPU's cache


def blocks(size: int) -> Iterator[slice]:
    """Consecutive slices of at most BLOCK elements covering range(size)."""
    for start in range(0, size, BLOCK):
        yield slice(start, min(start + BLOCK, size))


def flat(array: np.ndarray) -> np.ndarray:
    """A 1-D view of an array (a copy only when it is not contiguous)."""
    return np.ascontiguousarray(array).reshape(-1)


def weighted_average(models: Sequence[Sequence[np.ndarray]], weights: Sequence[float]) -> list[np.ndarray]:
    """Layer-wise sum_k w_k * model_k / sum_k w_k, accumulated in float64, returned as float32.

    Each element is accumulated in client order (the same bits as a whole-array loop), a cache-sized block of
    elements at a time: the accumulator stays in the cache instead of making a trip to memory per client."""
    if not models:
        raise ValueError("nothing to average")
    if len(models) != len(weights):
        raise ValueError(f"{len(models)} models but {len(weights)} weights")
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {weights}")
    w = w / w.sum()
    out = []
    for layer in zip(*models, strict=True):
        shape = layer[0].shape
        flats = [flat(arr) for arr in layer]
        result = np.empty(flats[0].size, dtype=np.float32)
        acc = np.empty(min(BLOCK, result.size), dtype=np.float64)
        scratch = np.empty_like(acc)
        for part in blocks(result.size):
            n = part.stop - part.start
            acc[:n] = 0.0
            for wk, arr in zip(w, flats):
                np.multiply(arr[part], wk, out=scratch[:n])  # no temporary per client
                acc[:n] += scratch[:n]
            result[part] = acc[:n]
        out.append(result.reshape(shape))
    return out


def server_step(x: Sequence[np.ndarray], mean: Sequence[np.ndarray], rate: float) -> list[np.ndarray]:
    """x <- x + rate (mean - x): the global model moved part of the way (rate 1: all of it; above 1: beyond) toward
    the round's aggregate (SCAFFOLD's server learning rate, pFedMe's beta)."""
    return [
        (np.asarray(a, np.float32) + rate * (np.asarray(m, np.float32) - a)).astype(np.float32)
        for a, m in zip(x, mean, strict=True)
    ]


def weighted_sum(arrays: Sequence[np.ndarray], sizes: Sequence[float]) -> np.ndarray:
    """sum_c size_c * array_c in float64, in client order, a cache-sized block at a time (the bits of a whole-array
    loop starting from zeros)."""
    flats = [flat(a) for a in arrays]
    summed = np.empty(flats[0].size, np.float64)
    for part in blocks(summed.size):
        acc = np.zeros(part.stop - part.start, np.float64)
        for size, values in zip(sizes, flats, strict=True):
            acc += size * values[part].astype(np.float64)
        summed[part] = acc
    return summed.reshape(np.shape(arrays[0]))


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population std of the finite values (nan, nan when none)."""
    arr = np.asarray([v for v in values if np.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std())
