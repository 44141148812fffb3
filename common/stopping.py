"""The plateau rule of `stop-patience`: whether a run's best mean accuracy has stopped improving."""

from __future__ import annotations

from collections.abc import Iterable

from common.learning.evaluate import shift_key
from common.storage.run_folder import RoundRecord, evaluation_means


def accuracy_curve(records: Iterable[RoundRecord]) -> list[tuple[int, float]]:
    """(round, mean accuracy at shift 0) of every evaluated round record, in record order."""
    key = shift_key(0.0)
    means = [(int(r["round"]), evaluation_means(r)) for r in records]
    return [(rnd, float(mean[key])) for rnd, mean in means if key in mean]


def stalled(curve: list[tuple[int, float]], patience: int, min_delta: float) -> bool:
    """True when, `patience` rounds or more into the run, no evaluation in the last `patience` rounds beat the
    best one before them by more than `min_delta`. Until an evaluation older than the window exists there is
    nothing to compare with, so a young run never stalls; a NaN accuracy never counts as improving."""
    if patience <= 0 or not curve:
        return False
    last = curve[-1][0]
    before = [acc for rnd, acc in curve if rnd <= last - patience and acc == acc]
    if not before:
        return False
    bar = max(before) + min_delta
    return not any(acc > bar for rnd, acc in curve if rnd > last - patience)  # NaN > bar is False


def best_round(curve: list[tuple[int, float]]) -> int | None:
    """The first round that reached the best mean accuracy (None for a curve without a number)."""
    finite = [(rnd, acc) for rnd, acc in curve if acc == acc]
    if not finite:
        return None
    top = max(acc for _, acc in finite)
    return next(rnd for rnd, acc in finite if acc == top)
