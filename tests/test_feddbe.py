"""FedDBE: the running mean and the regularized loss on hand-made tensors, round 0's means combined into the global
mean and sent on, the bias kept on the device and never uploaded, bad means rejected, DP refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import MetricRecord, RecordDict
from torch import nn
from torch.nn import functional as F

from client_app.algorithms.feddbe import BIAS
from common.config import ConfigError, parse_run_config
from common.learning.models import SplitModel
from common.methods.feddbe import DBEModel, RunningMean, dbe_loss
from common.wire.records import to_record

from .fakes import FakeReply, hand_made_runner
from .inprocess import InProcessFederation


def test_the_loss_is_cross_entropy_with_the_bias_plus_kappa_times_the_mean_gap() -> None:
    torch.manual_seed(0)
    model = DBEModel(SplitModel(nn.Linear(3, 4), nn.Linear(4, 2)), torch.tensor([0.5, -0.5, 1.0, 0.0]))
    x, y, gm = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1]), torch.tensor([1.0, 2.0, 3.0, 4.0])
    running = RunningMean(4, momentum=0.25)
    running.value = torch.full((4,), 2.0)
    loss = dbe_loss(running, gm, weight=10.0)(model, x, y)
    features = model.shared.body(x)
    mean = 0.75 * 2.0 + 0.25 * features.mean(0)  # (1 - momentum) m + momentum mean(batch)
    want = F.cross_entropy(model.shared.head(features + model.bias), y) + 10.0 * torch.mean(0.5 * (mean - gm) ** 2)
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(running.value, mean.detach())
    assert not running.value.requires_grad
    plain = dbe_loss(RunningMean(4, 1.0), None, weight=10.0)(model, x, y)  # no global mean: no bias, no pull
    torch.testing.assert_close(plain, F.cross_entropy(model.shared(x), y))


def _federation() -> InProcessFederation:
    raw = {"algorithm": "feddbe", "dataset": "digits", "num-rounds": 3, "fraction-train": 1.0, "local-epochs": 1}
    return InProcessFederation({**raw, "lr": 0.1, "batch-size": 32}, 3)


def test_round_zero_gives_the_global_mean_and_the_bias_stays_on_the_device() -> None:
    fed = _federation()
    fed.warmup()
    strategy = fed.strategy
    assert len(strategy.round0) == 3 and strategy.global_mean is None
    means = [mean for mean, _ in strategy.round0]
    weights = [weight for _, weight in strategy.round0]
    replies = fed.train_round(1)
    want = np.average(np.stack(means), axis=0, weights=weights)
    np.testing.assert_allclose(strategy.global_mean, want, rtol=1e-5, atol=1e-6)
    sent = fed.sent[1][0]
    np.testing.assert_array_equal(sent.array_records["feature-mean"]["mean"].numpy(), strategy.global_mean)
    assert "feature-mean" not in replies[0].array_records  # rounds 1+: the model alone travels back
    assert set(replies[0].array_records["arrays"].keys()) == {name for name, _ in strategy.specs}
    bias = fed.client(0).env.state.load_arrays(BIAS)
    assert bias is not None and bias[0].shape == (128,) and np.any(bias[0] != 0)
    metrics = fed.evaluate(1)[0].metric_records["metrics"]
    assert {"acc-shift-0", "global-acc-shift-0"} <= set(metrics.keys())  # with the bias, and the model alone


def test_a_bad_mean_is_rejected_and_the_others_are_kept() -> None:
    cfg = parse_run_config({"algorithm": "feddbe"})
    specs = [("body.weight", (4, 3)), ("head.weight", (2, 4))]
    runner = hand_made_runner(cfg, specs, [np.zeros(s, np.float32) for _, s in specs], {0: 10, 1: 10, 2: 30})

    def reply(value: float, size: int = 4) -> RecordDict:
        return RecordDict(
            {
                "feature-mean": to_record(["mean"], [np.full(size, value, np.float32)]),
                "metrics": MetricRecord({"num-examples": 10, "train-loss": 0.5}),
            }
        )

    runner.aggregate_train(
        0, [FakeReply(100, reply(1.0)), FakeReply(101, reply(np.nan)), FakeReply(102, reply(5.0, 3))]
    )
    assert len(runner.strategy.round0) == 1
    np.testing.assert_array_equal(runner.strategy.mean_record()["mean"].numpy(), np.ones(4, np.float32))


def test_settings_feddbe_cannot_honour_are_refused() -> None:
    with pytest.raises(ConfigError, match="mean representation travels in round 0"):
        parse_run_config({"algorithm": "feddbe", "dp": "central", "dp-noise-multiplier": 1.0})
    with pytest.raises(ConfigError, match="feddbe-momentum"):
        parse_run_config({"algorithm": "feddbe", "feddbe-momentum": 0})
