"""The base strategy in-process: FedAvg aggregation of valid replies only, rejections logged, sampling."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from common.config import parse_run_config

from .fakes import FakeReply, hand_made_runner, metrics_only, train_content

SPECS = [("body.w", (2, 2)), ("head.b", (3,))]
NAMES = [n for n, _ in SPECS]


def _runner(name: str = "fedavg", **overrides):
    cfg = parse_run_config(
        {"algorithm": name, "num-rounds": 5, "fraction-train": 0.3, "min-train-clients": 2, **overrides}
    )
    initial = [np.zeros((2, 2), np.float32), np.zeros(3, np.float32)]
    return hand_made_runner(cfg, SPECS, initial, {pid: 50 for pid in range(10)})


def _model(value: float):
    return [np.full((2, 2), value, np.float32), np.full(3, -value, np.float32)]


def test_fedavg_aggregates_only_valid_replies(caplog) -> None:
    runner = _runner()
    bad_shape = train_content(NAMES, [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)], 50)
    nan = train_content(NAMES, [np.full((2, 2), np.nan, np.float32), np.zeros(3, np.float32)], 50)
    replies = [
        FakeReply(100, train_content(NAMES, _model(1.0), 10)),
        FakeReply(101, train_content(NAMES, _model(4.0), 30)),
        FakeReply(102, bad_shape),
        FakeReply(103, nan),
        FakeReply(104, metrics_only(**{"train-loss": 0.1})),
        FakeReply(105, error="ClientAppException: out of memory"),
        FakeReply(999, train_content(NAMES, _model(9.0), 10)),
    ]
    with caplog.at_level(logging.WARNING):
        runner.aggregate_train(1, replies)
    assert np.array_equal(runner.strategy.global_arrays[0], np.full((2, 2), 3.25, np.float32))
    assert np.array_equal(runner.strategy.global_arrays[1], np.full(3, -3.25, np.float32))
    log = caplog.text
    assert "client 2: training reply rejected: array 'body.w' declares shape (2, 3), expected (2, 2)" in log
    assert "client 3: training reply rejected: array 'body.w' has NaN or Inf values" in log
    assert "client 4: training reply rejected: missing metric 'num-examples'" in log
    assert "client 5 (node 105) failed: ClientAppException: out of memory" in log
    assert "reply from unknown node 999 ignored" in log
    train = runner.round_log.train
    assert (train["used"], train["rejected"], train["failed"], train["clients"]) == (2, 3, 2, [0, 1])
    assert runner.round_log.bytes["train_up"] > 2 * 7 * 4


def test_no_valid_reply_keeps_the_model() -> None:
    runner = _runner()
    before = [a.copy() for a in runner.strategy.global_arrays]
    runner.aggregate_train(1, [FakeReply(100, error="timeout")])
    assert all(np.array_equal(a, b) for a, b in zip(before, runner.strategy.global_arrays))
    assert runner.round_log.train["used"] == 0


def test_local_ignores_arrays_and_keeps_nothing_global() -> None:
    runner = _runner("local")
    runner.aggregate_train(1, [FakeReply(100, metrics_only(**{"num-examples": 5, "train-loss": 0.2}))])
    assert runner.round_log.train["used"] == 1


def test_evaluation_mean_and_std_per_shift_degree(caplog) -> None:
    runner = _runner(**{"shift-degrees": "0,1"})
    replies = [
        FakeReply(100, metrics_only(**{"num-test": 4, "loss": 0.3, "acc-shift-0": 1.0, "acc-shift-1": 0.5})),
        FakeReply(101, metrics_only(**{"num-test": 4, "loss": 0.5, "acc-shift-0": 0.5, "acc-shift-1": 0.5})),
        FakeReply(102, metrics_only(**{"num-test": 4, "loss": 0.5, "acc-shift-0": 1.5, "acc-shift-1": 0.5})),
    ]
    with caplog.at_level(logging.WARNING):
        runner.aggregate_evaluate(1, replies)
    ev = runner.round_log.eval
    assert ev["num_clients"] == 2 and ev["mean"]["acc-shift-0"] == 0.75 and ev["std"]["acc-shift-0"] == 0.25
    assert ev["per_client"]["1"]["acc-shift-0"] == 0.5
    assert "client 2: evaluation reply rejected: metric 'acc-shift-0' = 1.5 is not in [0, 1]" in caplog.text


@pytest.mark.parametrize("rnd", [1, 2, 3])
def test_sampling_is_seeded_and_sized(rnd: int) -> None:
    a, b = _runner().strategy, _runner().strategy
    assert a.sample(rnd) == b.sample(rnd) and len(a.sample(rnd)) == 3
    assert a.sample(1) != a.sample(2) or a.sample(2) != a.sample(3)
    assert len(_runner(**{"fraction-train": 0.05}).strategy.sample(rnd)) == 2  # min-train-clients
    seeded = [_runner(seed=s).strategy.sample(1) for s in (1, 2)]
    assert seeded[0] != a.sample(1) or seeded[1] != a.sample(1)


def test_evaluate_schedule() -> None:
    runner = _runner(**{"eval-every": 2})
    assert [r for r in range(1, 6) if runner.should_evaluate(r)] == [2, 4, 5]
    assert not _runner(**{"eval-every": 0}).should_evaluate(5)
