"""Test-time mixture shift: a fraction p of a client's test samples replaced by draws from the pooled test data."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ShiftPlan:
    """Nested shifted test sets for one client: degree p replaces positions[:k(p)] with draws[:k(p)].

    Nesting means one forward pass over the client's test set plus one over the draws serves every
    degree, and a higher degree shifts a superset of the samples a lower one shifts.
    """

    test_indices: np.ndarray  # the client's own test samples (dataset indices)
    positions: np.ndarray  # permutation of range(len(test_indices)): the order positions get replaced
    draws: np.ndarray  # dataset indices drawn from the pool, one per position

    def num_replaced(self, degree: float) -> int:
        """How many test samples degree `degree` replaces (round half to even of p * n)."""
        return int(round(degree * len(self.test_indices)))

    def indices(self, degree: float) -> np.ndarray:
        """Dataset indices of the shifted test set at `degree`."""
        out = self.test_indices.copy()
        k = self.num_replaced(degree)
        out[self.positions[:k]] = self.draws[:k]
        return out


def make_shift_plan(test_indices: np.ndarray, pool: np.ndarray, seed: int) -> ShiftPlan:
    """Seeded plan: which positions get replaced, in order, and by which pool samples (without replacement)."""
    rng = np.random.default_rng(seed)
    n = len(test_indices)
    positions = rng.permutation(n)
    draws = rng.choice(pool, size=n, replace=n > len(pool))
    return ShiftPlan(np.asarray(test_indices), positions, np.asarray(draws))


def shifted_correct(
    plan: ShiftPlan, own_correct: np.ndarray, draw_correct: np.ndarray, degrees: tuple[float, ...]
) -> dict[float, float]:
    """Accuracy at each degree from per-sample correctness of the own test set and of the draws."""
    n = len(plan.test_indices)
    out: dict[float, float] = {}
    for degree in degrees:
        if n == 0:
            out[degree] = float("nan")
            continue
        correct = own_correct.astype(bool).copy()
        k = plan.num_replaced(degree)
        correct[plan.positions[:k]] = draw_correct[:k].astype(bool)
        out[degree] = float(correct.mean())
    return out
