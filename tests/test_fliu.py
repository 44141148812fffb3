"""FLIU: the adaptive gamma of Eq. 4 at each strict boundary and the individualized update of Eq. 3."""

from __future__ import annotations

import numpy as np
import pytest

from common.methods.fliu import adaptive_gamma, individualized_update


@pytest.mark.parametrize(
    ("n_k", "expected"),
    [
        (1001, 0.9),
        (1000, 0.75),  # 10 n / K = 1000
        (501, 0.75),
        (500, 0.5),  # 5 n / K = 500
        (101, 0.5),
        (100, 0.25),  # n / K = 100
        (51, 0.25),
        (50, 0.1),  # n / (2K) = 50
        (0, 0.1),
        (10**6, 0.9),
    ],
)
def test_gamma_boundaries_are_strict(n_k: int, expected: float) -> None:
    assert adaptive_gamma(n_k, n_total=1000, num_clients=10) == expected


@pytest.mark.parametrize(("n_k", "expected"), [(100, 0.25), (101, 0.5), (50, 0.1), (51, 0.25), (1001, 0.75)])
def test_gamma_with_non_integer_thresholds(n_k: int, expected: float) -> None:
    # n / K = 100.1, n / (2K) = 50.05, 10 n / K = 1001.
    assert adaptive_gamma(n_k, n_total=1001, num_clients=10) == expected


@pytest.mark.parametrize("args", [(1, 10, 0), (-1, 10, 2), (1, -5, 2)])
def test_gamma_bad_inputs_raise(args: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        adaptive_gamma(*args)


def test_individualized_update_is_the_convex_mix() -> None:
    local = [np.array([1.0, 2.0], np.float32), np.array([[4.0]], np.float32)]
    glob = [np.array([3.0, -2.0], np.float32), np.array([[0.0]], np.float32)]
    out = individualized_update(local, glob, 0.75)
    assert np.array_equal(out[0], np.array([1.5, 1.0], np.float32))
    assert np.array_equal(out[1], np.array([[3.0]], np.float32))
    assert all(x.dtype == np.float32 for x in out)
    assert all(np.array_equal(a, b) for a, b in zip(individualized_update(local, glob, 1.0), local))
    assert all(np.array_equal(a, b) for a, b in zip(individualized_update(local, glob, 0.0), glob))


def test_individualized_update_does_not_modify_inputs() -> None:
    local = [np.ones(3, np.float32)]
    glob = [np.zeros(3, np.float32)]
    individualized_update(local, glob, 0.5)
    assert np.array_equal(local[0], np.ones(3)) and np.array_equal(glob[0], np.zeros(3))


@pytest.mark.parametrize(
    ("local", "glob", "gamma", "match"),
    [
        ([np.ones(2)], [np.ones(2), np.ones(1)], 0.5, "layers"),
        ([np.ones(2)], [np.ones(3)], 0.5, "shape"),
        ([np.ones(2)], [np.ones(2)], 1.5, r"\[0, 1\]"),
    ],
)
def test_individualized_update_bad_inputs_raise(local, glob, gamma: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        individualized_update(local, glob, gamma)
