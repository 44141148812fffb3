"""Aggregation math on plain numpy arrays."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def weighted_average(models: Sequence[Sequence[np.ndarray]], weights: Sequence[float]) -> list[np.ndarray]:
    """Layer-wise sum_k w_k * model_k / sum_k w_k, accumulated in float64, returned as float32."""
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
        acc = np.zeros(layer[0].shape, dtype=np.float64)
        scratch = np.empty(layer[0].shape, dtype=np.float64)
        for wk, arr in zip(w, layer):
            np.multiply(arr, wk, out=scratch)  # no temporary per client
            acc += scratch
        out.append(acc.astype(np.float32))
    return out


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population std of the finite values (nan, nan when none)."""
    arr = np.asarray([v for v in values if np.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std())
