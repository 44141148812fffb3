"""What every accuracy figure, a run's and a report's, shares: an axis that starts at a stated floor."""

from __future__ import annotations

import math
from collections.abc import Iterable


def accuracy_limits(values: Iterable[float], span: float = 20.0) -> tuple[float, float]:
    """Limits of an accuracy axis in %: multiples of 10 around the values, at least `span` points apart and within
    0..100, so that a 2-point difference never fills the axis."""
    finite = [v for v in values if math.isfinite(v)] or [0.0, 100.0]
    low = max(0.0, 10 * math.floor(min(finite) / 10))
    high = min(100.0, max(low + span, 10 * math.ceil(max(finite) / 10)))
    return max(0.0, min(low, high - span)), high


def accuracy_label(limits: tuple[float, float], what: str) -> str:
    """The y label of an accuracy axis, stating where it starts when not at 0."""
    return f"accuracy (%), {what}" + (f"; axis from {limits[0]:g}%" if limits[0] > 0 else "")
