"""Robust aggregation of uploaded models (run-config `robust-aggregation`): update norm clipping, coordinate-wise
trimmed mean and coordinate-wise median, on plain numpy arrays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .aggregate import weighted_average

ROBUST_METHODS = ("none", "clip", "trimmed-mean", "median")

Model = Sequence[np.ndarray]


@dataclass(frozen=True)
class RobustRule:
    """Which rule, and its settings: `clip_norm` 0 means the median update norm of the round."""

    method: str = "none"
    clip_norm: float = 0.0
    trim: float = 0.2


def update_norms(models: Sequence[Model], reference: Model) -> np.ndarray:
    """L2 norm of each model's update (model - reference) over all its arrays, in float64."""
    return np.array(
        [
            np.sqrt(sum(float(np.sum((m.astype(np.float64) - r) ** 2)) for m, r in zip(model, reference, strict=True)))
            for model in models
        ]
    )


def clip_updates(
    models: Sequence[Model], reference: Model, bound: float, norms: np.ndarray | None = None
) -> tuple[list[list[np.ndarray]], int]:
    """Each model whose update is longer than `bound` moved back along it to norm `bound`; how many were clipped
    (`norms`: the update norms when already computed)."""
    if not np.isfinite(bound) or bound < 0:
        raise ValueError(f"clip bound must be a finite non-negative number, got {bound}")
    out, clipped = [], 0
    for model, norm in zip(models, update_norms(models, reference) if norms is None else norms, strict=True):
        if norm > bound:
            scale = bound / norm
            out.append([(r + scale * (m.astype(np.float64) - r)).astype(np.float32) for m, r in zip(model, reference)])
            clipped += 1
        else:
            out.append([np.asarray(m, dtype=np.float32) for m in model])
    return out, clipped


def trimmed_count(num_models: int, trim: float) -> int:
    """Models dropped at each end of every coordinate: floor(trim * n), keeping at least one."""
    if not 0.0 <= trim < 0.5:
        raise ValueError(f"trim must lie in [0, 0.5), got {trim}")
    return min(int(np.floor(trim * num_models)), (num_models - 1) // 2)


def trimmed_mean(models: Sequence[Model], trim: float) -> list[np.ndarray]:
    """Coordinate-wise mean after dropping the `trimmed_count` largest and smallest values (unweighted)."""
    if not models:
        raise ValueError("nothing to average")
    k = trimmed_count(len(models), trim)
    out = []
    for layer in zip(*models, strict=True):
        stacked = np.sort(np.stack(layer).astype(np.float64), axis=0)
        out.append(stacked[k : len(layer) - k].mean(axis=0).astype(np.float32))
    return out


def coordinate_median(models: Sequence[Model]) -> list[np.ndarray]:
    """Coordinate-wise median of the models (unweighted)."""
    if not models:
        raise ValueError("nothing to average")
    return [
        np.median(np.stack(layer).astype(np.float64), axis=0).astype(np.float32) for layer in zip(*models, strict=True)
    ]


def robust_average(
    models: Sequence[Model], weights: Sequence[float], reference: Model, rule: RobustRule
) -> tuple[list[np.ndarray], dict[str, Any]]:
    """The round's aggregate under `rule`, and what the rule did (empty for plain weighted averaging).

    clip: updates longer than the bound are shortened to it, then the sample-weighted average;
    trimmed-mean / median: coordinate-wise over the models, ignoring sample counts (a count is what an attacker
    inflates first)."""
    if rule.method == "none":
        return weighted_average(models, weights), {}
    if rule.method == "clip":
        norms = update_norms(models, reference)
        bound = rule.clip_norm if rule.clip_norm > 0 else float(np.median(norms))
        clipped, count = clip_updates(models, reference, bound, norms)
        return weighted_average(clipped, weights), {
            "method": "clip",
            "norm_bound": bound,
            "clipped": count,
            "max_norm": float(norms.max()),
        }
    if rule.method == "trimmed-mean":
        return trimmed_mean(models, rule.trim), {
            "method": "trimmed-mean",
            "trimmed_each_end": trimmed_count(len(models), rule.trim),
        }
    if rule.method == "median":
        return coordinate_median(models), {"method": "median"}
    raise ValueError(f"unknown robust aggregation {rule.method!r}; one of {', '.join(ROBUST_METHODS)}")


def boosted_upload(
    upload: dict[str, np.ndarray], received: dict[str, np.ndarray], boost: float
) -> dict[str, np.ndarray]:
    """A model-replacement attacker's upload (simulation, `attack-clients`): received + boost * (upload - received)
    for every array it received, so that averaging with the others lands near the attacker's model."""
    return {
        name: (received[name] + boost * (value - received[name])).astype(np.float32)
        if name in received and received[name].shape == value.shape
        else value
        for name, value in upload.items()
    }
