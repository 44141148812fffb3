"""Robust aggregation of uploaded models (run-config `robust-aggregation`): update norm clipping, coordinate-wise
trimmed mean and coordinate-wise median, on plain numpy arrays."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.methods.aggregate import weighted_average
from common.seeding import derive_seed

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
    norms = update_norms(models, reference) if norms is None else np.asarray(norms, dtype=np.float64)
    longer = norms > bound
    scales = np.where(longer, bound / np.where(longer, norms, 1.0), 1.0)
    return scale_updates(models, reference, scales.tolist()), int(longer.sum())


def peer_scales(norms: Sequence[float] | np.ndarray, ratio: float) -> np.ndarray:
    """Each update's factor under the peer bound: an update longer than `ratio` times the median norm of the
    round's *other* updates is shortened to that length (factor < 1), the others kept (1). The reference leaves the
    update itself out, so no client moves its own bound; with a single update there is no reference (1)."""
    if not np.isfinite(ratio) or ratio <= 0:
        raise ValueError(f"the peer bound's ratio must be a positive finite number, got {ratio}")
    norms_array = np.asarray(norms, dtype=np.float64)
    scales = np.ones(len(norms_array))
    for i, norm in enumerate(norms_array):
        others = np.delete(norms_array, i)
        if others.size == 0 or norm <= 0:
            continue
        bound = ratio * float(np.median(others))
        if norm > bound:
            scales[i] = bound / norm
    return scales


def scale_updates(models: Sequence[Model], reference: Model, scales: Sequence[float]) -> list[list[np.ndarray]]:
    """Each model moved back along its update (model - reference) by its factor (1: kept as it is)."""
    return [
        [np.asarray(m, np.float32) for m in model]
        if scale >= 1.0
        else [
            (r + scale * (m.astype(np.float64) - r)).astype(np.float32) for m, r in zip(model, reference, strict=True)
        ]
        for model, scale in zip(models, scales, strict=True)
    ]


MIN_ROBUST_MODELS = 3  # trimmed mean and median need one update at each end besides the one they keep


def trimmed_count(num_models: int, trim: float) -> int:
    """Models dropped at each end of every coordinate: floor(trim * n), at least one (a trimmed mean that trims
    nothing is a plain mean: with 4 clients one update of 1e6 would set the result), keeping at least one."""
    if not 0.0 <= trim < 0.5:
        raise ValueError(f"trim must lie in [0, 0.5), got {trim}")
    if num_models < MIN_ROBUST_MODELS:
        raise ValueError(f"a trimmed mean of {num_models} models cannot trim one from each end")
    return min(max(1, int(np.floor(trim * num_models))), (num_models - 1) // 2)


def robust_needs(method: str, per_round: int) -> str:
    """Why a run with `per_round` training clients a round cannot use the robust rule `method`."""
    return (
        f"robust-aggregation '{method}' needs at least {MIN_ROBUST_MODELS} training clients a round to outvote a "
        f"bad update; this run trains {per_round} (more clients, a larger fraction-train or min-train-clients, or "
        "robust-aggregation 'none')"
    )


RECIPES = {  # what deploy/README.md's recipes set, by the key that protects
    "robust-aggregation": "robust-aggregation='clip' and max-weight-ratio=4",
    "max-weight-ratio": "max-weight-ratio=4 and max-update-ratio=3",
    "max-update-ratio": "max-update-ratio=3",
}


def unprotected(algorithm: str, protected_by: Sequence[str], active: set[str], allow_unprotected: bool) -> str | None:
    """Why a deployment of `algorithm` may not start (None: it may): none of the run-config keys that protect it
    (`protected_by`, AlgorithmSpec.protected_by) is among those set (`active`), so one device's key moves the models
    the others receive where it likes (a boosted update, an inflated count)."""
    if not protected_by or active & set(protected_by) or allow_unprotected:
        return None
    return (
        f"a deployment of {algorithm} without {' or '.join(protected_by)} lets one device steer the models the "
        f"others receive: set {RECIPES[protected_by[0]]} as the recipes do (deploy/README.md), or "
        "allow-unprotected=true"
    )


def walk_unbounded(algorithm: str, bounds_updates: bool, lr_decay: float) -> str | None:
    """The warning of a deployment in which one device may walk the models without end (None: none): its server
    averages or mixes uploads at a constant learning rate, where the per-round bounds follow honest updates that do
    not shrink, so their sum over the rounds, and a walk inside them, has no end (docs/robustness.md)."""
    if not bounds_updates or lr_decay < 1.0:
        return None
    return (
        f"{algorithm} at a constant learning rate: the per-round bounds let one device walk the models a little in "
        "one direction every round without end; lr-decay below 1 makes that walk's total finite "
        "(docs/robustness.md, 'the walk')"
    )


def capped_weights(weights: Sequence[float]) -> tuple[np.ndarray, int]:
    """Each weight at most the median weight of the round (no client outweighs a typical one), and how many were
    capped: under `clip` a client's share of the average stays near 1/n whatever count it declares."""
    w = np.asarray(weights, dtype=np.float64)
    cap = float(np.median(w))
    return np.minimum(w, cap), int(np.sum(w > cap))


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


def robust_clip(
    models: Sequence[Model], reference: Model, rule: RobustRule
) -> tuple[list[list[np.ndarray]], dict[str, Any]]:
    """`clip`'s first step: every update shortened to the rule's bound (0: the round's median update norm); the
    clipped models and what it did."""
    norms = update_norms(models, reference)
    bound = rule.clip_norm if rule.clip_norm > 0 else float(np.median(norms))
    clipped, count = clip_updates(models, reference, bound, norms)
    return clipped, {"method": "clip", "norm_bound": bound, "clipped": count, "max_norm": float(norms.max())}


def robust_average(
    models: Sequence[Model], weights: Sequence[float], reference: Model, rule: RobustRule
) -> tuple[list[np.ndarray], dict[str, Any]]:
    """The round's aggregate under `rule`, and what the rule did (empty for plain weighted averaging).

    clip: updates longer than the bound are shortened to it, then the average weighted by sample counts capped at
    the round's median count; trimmed-mean / median: coordinate-wise over the models, ignoring sample counts (a
    count is what an attacker inflates first). With fewer than MIN_ROBUST_MODELS updates no rule can outvote a bad
    one: the round keeps `reference` and the report says why ("skipped")."""
    if rule.method not in ROBUST_METHODS:
        raise ValueError(f"unknown robust aggregation {rule.method!r}; one of {', '.join(ROBUST_METHODS)}")
    if rule.method == "none":
        return weighted_average(models, weights), {}
    if len(models) < MIN_ROBUST_MODELS:  # no rule can outvote one bad update among two: keep the reference
        return [np.array(r, dtype=np.float32) for r in reference], {
            "method": rule.method,
            "skipped": f"{len(models)} update(s), fewer than the {MIN_ROBUST_MODELS} a robust rule needs",
        }
    if rule.method == "clip":
        clipped, report = robust_clip(models, reference, rule)
        capped, weights_capped = capped_weights(weights)
        return weighted_average(clipped, capped.tolist()), {**report, "weights_capped": weights_capped}
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


def walk_seed(run_seed: int) -> int:
    """The seed of the walking attackers' direction, from the run's seed (the server's diagnostics use it too)."""
    return derive_seed(run_seed, "attack-walk")


def walk_direction(length: int, seed: int) -> np.ndarray:
    """The walking attackers' direction (simulation, `attack-walk`): a seeded unit vector over a flat model."""
    direction = np.random.default_rng(seed).standard_normal(length)
    return direction / np.linalg.norm(direction)


def walked_upload(
    upload: dict[str, np.ndarray], received: dict[str, np.ndarray], step: float, seed: int
) -> dict[str, np.ndarray]:
    """A walking attacker's upload (simulation, `attack-walk`): what it received plus `step` times its own update's
    length along the seeded direction over the arrays it received (in their order), every round the same way; a
    step the per-round bounds let through whose sum over rounds has no end."""
    names = [name for name, value in received.items() if name in upload and upload[name].shape == value.shape]
    length = int(sum(received[name].size for name in names))
    own = np.sqrt(sum(float(np.sum((upload[n].astype(np.float64) - received[n]) ** 2)) for n in names))
    direction = walk_direction(length, seed) * step * own
    out, at = dict(upload), 0
    for name in names:
        size = received[name].size
        out[name] = (received[name] + direction[at : at + size].reshape(received[name].shape)).astype(np.float32)
        at += size
    return out
