"""Test-time shift: exactly round(p*n) samples replaced, by draws from the pooled test data, nested, seeded."""

from __future__ import annotations

import numpy as np
import pytest

from common.data.shift import make_shift_plan, shifted_correct

OWN = np.arange(1000, 1037)  # 37 test samples of one client
POOL = np.concatenate([OWN, np.arange(5000, 5400)])  # pooled test data of all clients (includes its own)
DEGREES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


@pytest.mark.parametrize("degree", DEGREES)
def test_exact_fraction_replaced_by_pool_draws(degree: float) -> None:
    plan = make_shift_plan(OWN, POOL, seed=3)
    shifted = plan.indices(degree)
    k = int(round(degree * len(OWN)))
    replaced = plan.positions[:k]
    kept = plan.positions[k:]
    assert len(shifted) == len(OWN)
    assert np.array_equal(shifted[kept], OWN[kept])
    assert np.array_equal(shifted[replaced], plan.draws[:k])
    assert set(plan.draws.tolist()) <= set(POOL.tolist())
    assert len(set(plan.draws.tolist())) == len(OWN), "draws are without replacement"


def test_plans_are_nested_and_seeded() -> None:
    plan = make_shift_plan(OWN, POOL, seed=3)
    assert np.array_equal(plan.indices(0.0), OWN)
    low = set(plan.positions[: plan.num_replaced(0.4)].tolist())
    high = set(plan.positions[: plan.num_replaced(0.8)].tolist())
    assert low < high
    again = make_shift_plan(OWN, POOL, seed=3)
    assert np.array_equal(again.draws, plan.draws) and np.array_equal(again.positions, plan.positions)
    assert not np.array_equal(make_shift_plan(OWN, POOL, seed=4).draws, plan.draws)


def test_shifted_accuracy_equals_direct_count() -> None:
    rng = np.random.default_rng(0)
    correct_by_index = {int(i): bool(rng.random() < 0.7) for i in POOL}
    plan = make_shift_plan(OWN, POOL, seed=9)
    own = np.array([correct_by_index[int(i)] for i in OWN])
    draws = np.array([correct_by_index[int(i)] for i in plan.draws])
    fast = shifted_correct(plan, own, draws, DEGREES)
    for degree in DEGREES:
        direct = np.mean([correct_by_index[int(i)] for i in plan.indices(degree)])
        assert fast[degree] == pytest.approx(direct)
