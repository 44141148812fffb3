"""Distributed DP under secure aggregation (run-config `dp` = distributed, common/methods/distributed_dp.py): the
discrete Gaussian sampler's law, the integer sum that cannot wrap, the sensitivity of a rounded update, the round's
rho and the accountant's epsilon, and a round through the runner whose server sees only the noised sum."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from common.config import ConfigError, parse_run_config
from common.methods.distributed_dp import (
    PrivacyLedger,
    client_contribution,
    discrete_gaussian,
    mean_update,
    noise_multiplier_for,
    plan_round,
    round_rho,
    zcdp_epsilon,
)
from common.methods.privacy import epsilon
from common.secagg.encoding import Layout, Section, decode, encode, plain_sum
from common.secagg.params import SecAggParams
from common.wire.messages import ARRAYS

from .test_secagg_round import SIZES, SecureClients, _runner, server_identity  # noqa: F401


@pytest.mark.parametrize("sigma", [0.7, 2.5, 9.0])
def test_the_sampler_draws_the_discrete_gaussian(sigma: float) -> None:
    draws = discrete_gaussian(sigma, 200_000, np.random.default_rng(1))
    support = np.arange(-int(12 * sigma) - 2, int(12 * sigma) + 3)
    weights = np.exp(-(support.astype(np.float64) ** 2) / (2 * sigma**2))
    exact = weights / weights.sum()
    counts = np.array([np.sum(draws == k) for k in support])
    assert counts.sum() == draws.size  # nothing outside 12 sigma
    expected = exact * draws.size
    used = expected > 20  # Pearson's statistic on the cells with enough mass, against its mean and spread
    chi2 = float(np.sum((counts[used] - expected[used]) ** 2 / expected[used]))
    dof = int(used.sum()) - 1
    assert chi2 < dof + 5 * math.sqrt(2 * dof)
    assert abs(draws.mean()) < 5 * sigma / math.sqrt(draws.size)


def test_a_large_sigma_has_the_continuous_variance() -> None:
    draws = discrete_gaussian(300.0, 100_000, np.random.default_rng(2))
    assert draws.dtype == np.int64
    assert np.std(draws) == pytest.approx(300.0, rel=0.02)


def test_the_rounded_update_stays_within_the_sensitivity() -> None:
    rng = np.random.default_rng(3)
    plan = plan_round(clip=0.5, noise_multiplier=1e-9, dimension=400, cohort=10, modulus=2**32)
    update = rng.normal(size=400) * 3.0  # norm ~60: clipped to 0.5
    for _ in range(20):  # noise of std ~1e-9 draws 0: the contribution is the rounded update alone
        rounded = client_contribution(update, 0.5, plan, rng)
        assert np.linalg.norm(rounded) <= plan.sensitivity
        clipped = update * 0.5 / np.linalg.norm(update)
        assert np.max(np.abs(rounded / plan.scale - clipped)) < 1 / plan.scale
    assert plan.sensitivity == pytest.approx(plan.scale * 0.5 + 20.0)


def test_the_cohorts_worst_sum_and_noise_fit_the_modulus() -> None:
    params = SecAggParams(modulus_range=2**32)
    cohort, dimension, z = 50, 64, 3.0
    plan = plan_round(1.0, z, dimension, cohort, params.modulus_range)
    layout = Layout((Section("u", dimension, "signed"),))
    worst = np.zeros(dimension)
    worst[0] = -1.0  # every client's whole norm on one coordinate, all of one sign
    rng = np.random.default_rng(4)
    contributions = [client_contribution(worst, 1.0, plan, rng) for _ in range(cohort)]
    vectors = [encode(layout, {"u": c}, 0.0, params, rng, units=1)[0] for c in contributions]
    decoded = decode(layout, plain_sum(vectors, params), cohort, params)
    assert decoded.weight_units == cohort
    np.testing.assert_array_equal(decoded.integers["u"], np.sum(contributions, axis=0))  # exact, signs kept
    assert mean_update(decoded.integers["u"], plan, cohort)[0] == pytest.approx(-1.0, abs=5 * z / cohort)
    with pytest.raises(ValueError, match="raise secagg-modulus-range"):
        plan_round(1.0, z, 10**8, 100_000, 2**32)


def test_the_summed_noise_has_the_planned_std() -> None:
    plan = plan_round(1.0, 2.0, 20_000, 8, 2**32)
    rng = np.random.default_rng(5)
    total = sum(client_contribution(np.zeros(20_000), 1.0, plan, rng) for _ in range(8))
    assert np.std(total) == pytest.approx(2.0 * plan.sensitivity, rel=0.02)  # z D: central DP's noise on the sum


def test_a_rounds_rho_is_the_gaussians_and_grows_when_fewer_answer() -> None:
    plan = plan_round(1.0, 1.5, 1000, 20, 2**32)
    assert round_rho(plan, 20) == pytest.approx(1 / (2 * 1.5**2), rel=1e-9)  # tau underflows at this sigma
    assert round_rho(plan, 5) == pytest.approx(20 / 5 / (2 * 1.5**2), rel=1e-9)
    ledger = PrivacyLedger(1e-5)
    for clients in ([0, 1, 2], [0, 1], [0, 3]):
        ledger.record(clients, round_rho(plan, 20))
    # client 0 in all three sums: three Gaussian mechanisms of multiplier z, as dp-accounting's Gaussian gives them
    assert ledger.epsilon() == pytest.approx(epsilon(1.5, 1.0, 3, 1e-5), rel=1e-6)
    assert zcdp_epsilon(0.0, 1e-5) == 0.0


def test_colluding_clients_noise_is_not_counted_on() -> None:
    from dataclasses import replace

    plan = plan_round(1.0, 2.0, 20_000, 10, 2**32, colluding=3)
    # any 7 honest clients' noise alone is z D: the 3 who may tell the server theirs (or add none) are not needed
    rng = np.random.default_rng(6)
    honest = sum(client_contribution(np.zeros(20_000), 1.0, plan, rng) for _ in range(7))
    assert np.std(honest) == pytest.approx(2.0 * plan.sensitivity, rel=0.02)
    assert plan.local_std == pytest.approx(2.0 * plan.sensitivity / math.sqrt(7))
    # a sum of 10 counts 7 clients' noise: the rho of a sum of 7 noised clients with nobody colluding
    assert round_rho(plan, 10) == round_rho(replace(plan, colluding=0), 7)
    assert round_rho(plan, 10) == pytest.approx(1 / (2 * 2.0**2), rel=1e-9)
    assert round_rho(plan, 3) == math.inf  # only colluders' noise might be in it
    ledger = PrivacyLedger(1e-5)
    ledger.record([0], round_rho(plan, 3))
    assert ledger.epsilon() == math.inf
    # the whole cohort's larger noise still fits the modulus: its 40-std tail beside the worst sum
    half = 2**32 / 2 - 1
    assert 10 * (plan.scale * 1.0 + 1) + 40 * plan.local_std * math.sqrt(10) <= half
    with pytest.raises(ValueError, match="leaves no client of a round of 10"):
        plan_round(1.0, 2.0, 100, 10, 2**32, colluding=10)
    with pytest.raises(ConfigError, match="'dp-colluding-clients' is distributed DP's"):
        parse_run_config({"dp": "central", "dp-noise-multiplier": 1.0, "dp-colluding-clients": 2})


def test_a_round_with_colluders_counts_only_the_others_noise(server_identity: None) -> None:  # noqa: F811
    runner, cfg = _runner(**{"dp": "distributed", "dp-noise-multiplier": 2.0, "dp-colluding-clients": 2})
    grid = SecureClients(cfg)
    runner.train(grid, 1)
    private = runner.round_log.train["dp"]
    assert private["answered"] == 5 and private["colluding"] == 2
    assert private["effective_noise_multiplier"] == pytest.approx(2.0)
    assert private["rho"] == pytest.approx(1 / (2 * 2.0**2), rel=1e-6)


def test_a_target_epsilon_is_met_by_a_client_in_every_round() -> None:
    z = noise_multiplier_for(0.0, 4.0, 10, 1e-5)
    assert epsilon(z, 1.0, 10, 1e-5) <= 4.0
    assert epsilon(z * 0.98, 1.0, 10, 1e-5) > 4.0
    assert noise_multiplier_for(2.5, 0.0, 10, 1e-5) == 2.5


def test_a_round_through_the_runner_gives_the_unweighted_mean_update(server_identity: None) -> None:  # noqa: F811
    runner, cfg = _runner(**{"dp": "distributed", "dp-noise-multiplier": 1e-9, "dp-clip-norm": 100.0})
    grid = SecureClients(cfg)
    runner.train(grid, 1)
    want = [np.mean([grid.arrays[p][i] for p in SIZES], axis=0) for i in range(2)]  # sample counts do not weigh
    for got, expected in zip(runner.strategy.global_arrays, want, strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-6)
    train = runner.round_log.train
    assert train["num_examples"] == 0 and math.isnan(train["loss"])
    assert train["dp"]["mode"] == "distributed" and train["dp"]["answered"] == 5
    assert train["dp"]["epsilon"] == pytest.approx(zcdp_epsilon(train["dp"]["rho"], 1e-5))
    assert all(ARRAYS not in content for content in grid.received)


def test_a_dropout_lowers_the_noise_and_the_log_says_so(
    server_identity: None,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    from flwr.app import MessageType

    runner, cfg = _runner(**{"dp": "distributed", "dp-noise-multiplier": 2.0})
    grid = SecureClients(cfg, fail={2: MessageType.TRAIN})
    with caplog.at_level(logging.WARNING):
        runner.train(grid, 1)
    private = runner.round_log.train["dp"]
    assert private["answered"] == 4 and private["cohort"] == 5
    assert private["effective_noise_multiplier"] == pytest.approx(2.0 * math.sqrt(4 / 5))
    assert private["rho"] == pytest.approx(5 / 4 / (2 * 2.0**2), rel=1e-6)
    assert "4 of the cohort's 5 clients are in the sum" in caplog.text
    assert sorted(runner.strategy.dp_ledger.spent) == [0, 1, 3, 4]  # the dropped client spent nothing


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dp": "distributed", "dp-noise-multiplier": 1.0}, "set 'secagg' = 'secaggplus'"),
        (
            {"dp": "distributed", "dp-noise-multiplier": 1.0, "secagg": "secaggplus", "algorithm": "dmpfl"},
            "per-position counts",
        ),
        (
            {"dp": "distributed", "dp-noise-multiplier": 1.0, "secagg": "secaggplus", "algorithm": "scaffold"},
            "no DP mechanism here clips or noises it",
        ),
        (
            {"dp": "distributed", "dp-noise-multiplier": 1.0, "secagg": "secaggplus", "dp-adaptive-clip": True},
            "central DP's",
        ),
        ({"dp": "local", "dp-noise-multiplier": 1.0, "secagg": "secaggplus"}, "'distributed' has each client"),
    ],
)
def test_the_run_config_refuses_distributed_dp_where_it_cannot_hold(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_run_config(overrides)
