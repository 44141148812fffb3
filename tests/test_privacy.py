"""Client-level DP on sparse uploads (common/methods/privacy.py): clipping on each client's support, noise only
on the shared coordinates with the stated standard deviation, the accountant and the noise for a target epsilon,
the adaptive clip bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from common.methods.privacy import (
    adaptive_clip_step,
    central_dp_mean,
    clip_on_support,
    epsilon,
    local_dp_update,
    noise_for_epsilon,
    support_norm,
    update_noise_multiplier,
)

pytest.importorskip("dp_accounting")


def test_the_norm_and_the_clip_see_only_the_coordinates_a_client_sends() -> None:
    update = [np.array([3.0, 4.0, 100.0]), np.array([[0.0, 12.0]])]
    support = [np.array([True, True, False]), None]
    assert support_norm(update, support) == 13.0  # sqrt(9 + 16 + 144): the 100 is not sent
    clipped, norm = clip_on_support(update, support, 6.5)
    assert norm == 13.0
    np.testing.assert_allclose(clipped[0], [1.5, 2.0, 0.0])  # halved; the unsent coordinate is zero, not 50
    np.testing.assert_allclose(clipped[1], [[0.0, 6.0]])
    assert support_norm(clipped, support) == pytest.approx(6.5)
    same, _ = clip_on_support(update, support, 20.0)
    np.testing.assert_array_equal(same[1], update[1])  # inside the bound: unchanged
    with pytest.raises(ValueError, match="boolean"):
        support_norm(update, [np.array([1, 1, 0]), None])


def test_without_noise_the_central_mean_is_the_clipped_sum_over_the_planned_clients() -> None:
    a = [np.array([2.0, 0.0, 0.0, 0.0])]
    b = [np.array([0.0, 30.0, 40.0, 0.0])]  # norm 50, clipped to 10: (0, 6, 8, 0)
    supports = [[np.array([True, False, False, False])], [np.array([False, True, True, False])]]
    shared = [np.array([True, True, False, False])]  # the server knows coordinates 0 and 1 are shared
    mean, report = central_dp_mean([a, b], supports, shared, 10.0, 0.0, 4, np.random.default_rng(0))
    np.testing.assert_allclose(mean[0], [0.5, 1.5, 0.0, 0.0])  # (2 + 0) / 4, (0 + 6) / 4; coordinate 2 left out
    assert report == {"clip_bound": 10.0, "noise_std": 0.0, "clipped": 1.0}


def test_the_noise_lands_only_on_shared_coordinates_with_std_sigma_c_over_n() -> None:
    size = 400_000
    shared = [np.arange(size) % 4 != 0]  # three quarters shared
    zero = [np.zeros(size)]
    mean, report = central_dp_mean([zero] * 5, [[None]] * 5, shared, 2.0, 1.5, 10, np.random.default_rng(1))
    assert report["noise_std"] == pytest.approx(1.5 * 2.0 / 10)
    assert not mean[0][~shared[0]].any(), "no noise off the shared coordinates: the aggregate stays sparse"
    assert np.std(mean[0][shared[0]]) == pytest.approx(0.3, rel=0.01)
    assert abs(np.mean(mean[0][shared[0]])) < 0.003


def test_local_dp_keeps_the_upload_on_its_support() -> None:
    size = 200_000
    support = [np.arange(size) % 10 == 0]  # a 10% upload
    noised = local_dp_update([np.ones(size)], support, 1.0, 2.0, np.random.default_rng(2))
    assert np.count_nonzero(noised[0]) == size // 10, "as sparse as before"
    on = noised[0][support[0]]
    assert np.std(on) == pytest.approx(2.0, rel=0.02)  # z * C on each sent coordinate
    assert np.mean(on) == pytest.approx(1.0 / math.sqrt(size // 10), abs=0.02)  # the clipped value, unbiased


def test_epsilon_grows_with_rounds_and_shrinks_with_noise() -> None:
    values = [epsilon(1.0, 0.1, rounds, 1e-5) for rounds in (10, 100, 300)]
    assert values[0] < values[1] < values[2]
    assert epsilon(2.0, 0.1, 300, 1e-5) < values[2]
    assert epsilon(0.0, 0.1, 10, 1e-5) == math.inf and epsilon(1.0, 0.1, 0, 1e-5) == 0.0
    with pytest.raises(ValueError, match="sample rate"):
        epsilon(1.0, 0.0, 10, 1e-5)


@pytest.mark.parametrize("target", [1.0, 4.0, 8.0])
def test_the_noise_for_a_target_epsilon_reaches_it_within_one_percent(target: float) -> None:
    z = noise_for_epsilon(target, 0.1, 300, 1e-5)
    reached = epsilon(z, 0.1, 300, 1e-5)
    assert reached <= target and reached == pytest.approx(target, rel=0.01)
    assert epsilon(z * 0.98, 0.1, 300, 1e-5) > target, "less noise would not do"


def test_the_adaptive_bound_moves_toward_the_target_quantile() -> None:
    rng = np.random.default_rng(3)
    grow = adaptive_clip_step(1.0, [False] * 9 + [True], 0.5, 0.2, 0.0, rng)  # 10% below: raise C
    shrink = adaptive_clip_step(1.0, [True] * 9 + [False], 0.5, 0.2, 0.0, rng)
    assert grow == pytest.approx(math.exp(0.2 * 0.4)) and shrink == pytest.approx(math.exp(-0.2 * 0.4))
    assert adaptive_clip_step(1.0, [], 0.5, 0.2, 1.0, rng) == 1.0
    # Andrew et al.: z_update = (z^-2 - (2 sigma_b)^-2)^-1/2, a little above z
    assert update_noise_multiplier(1.0, 10.0) == pytest.approx((1 - 1 / 400) ** -0.5)
    with pytest.raises(ValueError, match="whole budget"):
        update_noise_multiplier(1.0, 0.4)
