"""Statistics across seeds: mean with a 95% confidence interval (Student t), and paired differences on shared seeds."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float, int]:
    """(mean, half-width of the `level` t-interval, n) of the finite values; half-width NaN for fewer than 2."""
    finite = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    n = len(finite)
    if n == 0:
        return float("nan"), float("nan"), 0
    mean = float(finite.mean())
    if n < 2:
        return mean, float("nan"), n
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * finite.std(ddof=1) / math.sqrt(n))
    return mean, half, n


def paired_difference(a: Mapping[int, float], b: Mapping[int, float], level: float = 0.95) -> tuple[float, float, int]:
    """mean_ci of a[seed] - b[seed] over the seeds both have (a paired comparison on the same seeds)."""
    shared = sorted(set(a) & set(b))
    return mean_ci([a[s] - b[s] for s in shared], level)


def fmt_ci(mean: float, half: float, scale: float = 100.0, digits: int = 2) -> str:
    """'12.34 +/- 0.56' (the interval omitted where it is undefined), 'n/a' for a missing mean."""
    if not math.isfinite(mean):
        return "n/a"
    text = f"{scale * mean:.{digits}f}"
    return text + (f" +/- {scale * half:.{digits}f}" if math.isfinite(half) else "")


INFORMATIVE_SEEDS = 3  # below this, a 95% t-interval is at least 4.3 standard errors wide (12.7 with two seeds)


def few_seeds_note(seeds: Mapping[str, int]) -> list[str]:
    """A paragraph naming the experiments (label -> seeds run) with fewer than INFORMATIVE_SEEDS seeds, whose
    intervals say little; no lines when every experiment has enough."""
    few = [f"`{label}` ({n})" for label, n in seeds.items() if n < INFORMATIVE_SEEDS]
    if not few:
        return []
    return [
        f"**Few seeds:** {', '.join(few)} ran fewer than {INFORMATIVE_SEEDS} seeds. Their +/- intervals are not "
        "informative (with 2 seeds, the 95% t-interval is 12.7 standard errors wide; with 1 there is none): run "
        "more seeds (e.g. `--seeds 0,1,2`) before reading differences from them.",
        "",
    ]
