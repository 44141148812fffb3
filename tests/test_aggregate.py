"""FedAvg aggregation: exact sample-weighted averages on hand-made arrays."""

from __future__ import annotations

import numpy as np
import pytest

from common.methods.aggregate import mean_std, weighted_average


def test_weighted_by_sample_counts_exactly() -> None:
    a = [np.array([1.0, 2.0], np.float32), np.array([[0.0]], np.float32)]
    b = [np.array([3.0, 6.0], np.float32), np.array([[4.0]], np.float32)]
    out = weighted_average([a, b], [1, 3])
    assert np.array_equal(out[0], np.array([2.5, 5.0], np.float32))
    assert np.array_equal(out[1], np.array([[3.0]], np.float32))
    assert all(x.dtype == np.float32 for x in out)


def test_single_model_is_returned_unchanged() -> None:
    a = [np.array([0.1, -7.25], np.float32)]
    assert np.array_equal(weighted_average([a], [42])[0], a[0])


@pytest.mark.parametrize("weights", [[0, 0], [-1, 2], [1]])
def test_bad_weights_raise(weights: list[int]) -> None:
    a = [np.zeros(2, np.float32)]
    with pytest.raises(ValueError):
        weighted_average([a, a], weights)


def test_mean_std_ignores_nan() -> None:
    assert mean_std([0.5, 1.0, float("nan")]) == (0.75, 0.25)
