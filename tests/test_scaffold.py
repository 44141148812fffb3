"""SCAFFOLD: option II's control variates on hand-made arrays, the corrected SGD step, one round in-process checked
against the paper's formulas, what travels, and the settings it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import MetricRecord, RecordDict
from torch import nn

from client_app.algorithms.scaffold import OWN_CONTROL
from common.config import ConfigError, parse_run_config
from common.learning.train import TrainSettings, train
from common.methods.aggregate import server_step
from common.methods.scaffold import client_control, corrected_gradients, server_control
from common.wire.records import to_record
from server_app.wire import wire_bytes

from .fakes import FakeReply, hand_made_runner
from .inprocess import InProcessFederation


def test_option_two_and_the_server_updates_on_hand_made_arrays() -> None:
    c_i, c, x, y = [np.array([1.0])], [np.array([3.0])], [np.array([10.0])], [np.array([4.0])]
    new, delta = client_control(c_i, c, x, y, steps=2, lr=0.5)
    np.testing.assert_allclose(new[0], [4.0])  # 1 - 3 + (10 - 4) / (2 x 0.5)
    np.testing.assert_allclose(delta[0], [3.0])
    same, zero = client_control(c_i, c, x, y, steps=0, lr=0.5)
    np.testing.assert_allclose(same[0], [1.0]) and np.testing.assert_allclose(zero[0], [0.0])
    np.testing.assert_allclose(server_step([np.array([2.0])], [np.array([6.0])], 0.5)[0], [4.0])
    np.testing.assert_allclose(server_control([np.array([1.0])], [np.array([4.0])], 2, 8)[0], [2.0])  # + 2/8 x 4
    with pytest.raises(ValueError, match="positive learning rate"):
        client_control(c_i, c, x, y, steps=1, lr=0.0)


def test_a_corrected_step_moves_by_minus_lr_times_c_minus_c_i() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(8, 3), torch.randint(0, 2, (8,))
    base = nn.Linear(3, 2)
    plain, corrected = nn.Linear(3, 2), nn.Linear(3, 2)
    plain.load_state_dict(base.state_dict()), corrected.load_state_dict(base.state_dict())
    settings = TrainSettings(epochs=1, batch_size=8, lr=0.1)  # one step
    shift = {"weight": torch.full((2, 3), 2.0), "bias": torch.tensor([1.0, -1.0])}
    train(plain, x, y, settings, torch.Generator().manual_seed(1))
    train(corrected, x, y, settings, torch.Generator().manual_seed(1), on_gradients=corrected_gradients(shift))
    for name, value in shift.items():
        moved = dict(corrected.named_parameters())[name] - dict(plain.named_parameters())[name]
        torch.testing.assert_close(moved.detach(), -0.1 * value)


def _federation(**overrides) -> InProcessFederation:
    raw = {"algorithm": "scaffold", "dataset": "digits", "num-rounds": 3, "fraction-train": 1.0, "local-epochs": 1}
    return InProcessFederation({**raw, "lr": 0.1, **overrides}, 3)


def test_one_round_follows_algorithm_one() -> None:
    fed = _federation()
    strategy = fed.strategy
    x = [a.copy() for a in strategy.global_arrays]
    names = [name for name, _ in strategy.specs]
    params = [name for name, _ in strategy.control_specs]
    assert params == names  # the MLP has no buffers: a control variate per entry
    replies = fed.train_round(1)
    sent = fed.sent[1][0]
    assert set(sent.array_records) == {"arrays", "control"}
    assert all(not np.any(a.numpy()) for a in sent.array_records["control"].values())  # c = 0 in round 1
    models = {pid: [r.array_records["arrays"][n].numpy() for n in names] for pid, r in replies.items()}
    deltas = {pid: [r.array_records["control"][n].numpy() for n in params] for pid, r in replies.items()}
    steps = {pid: int(r.metric_records["metrics"]["steps"]) for pid, r in replies.items()}
    for pid in range(3):  # c_i = 0, c = 0: delta c_i = (x - y_i) / (K lr), and c_i+ is kept on the device
        expected = [(a - b) / (steps[pid] * 0.1) for a, b in zip(x, models[pid])]
        for got, want in zip(deltas[pid], expected):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        kept = fed.client(pid).env.state.load_arrays(OWN_CONTROL)
        assert kept is not None and all(np.array_equal(k, d) for k, d in zip(kept, deltas[pid]))
    for i in range(len(names)):  # eta_g = 1: x is the uniform mean of the y_i; c the sum of the changes over N = 3
        np.testing.assert_allclose(strategy.global_arrays[i], np.mean([models[p][i] for p in range(3)], 0), atol=1e-6)
        np.testing.assert_allclose(strategy.control[i], np.sum([deltas[p][i] for p in range(3)], 0) / 3, atol=1e-6)
    c_after_round_1 = [c.copy() for c in strategy.control]
    fed.train_round(2)
    c_sent = fed.sent[2][0].array_records["control"]
    for i, name in enumerate(params):  # round 2 sends the c round 1 made
        np.testing.assert_array_equal(c_sent[name].numpy(), c_after_round_1[i])
    # twice FedAvg's bytes each way: the model and a parameter-sized control record
    model_only = RecordDict({"arrays": fed.sent[2][0].array_records["arrays"]})
    assert wire_bytes(fed.sent[2][0]) > 1.9 * wire_bytes(model_only)


def test_the_server_learning_rate_scales_the_step() -> None:
    fed = _federation(**{"scaffold-server-lr": 0.5})
    x = [a.copy() for a in fed.strategy.global_arrays]
    replies = fed.train_round(1)
    names = [name for name, _ in fed.strategy.specs]
    mean = [np.mean([r.array_records["arrays"][n].numpy() for r in replies.values()], 0) for n in names]
    for got, start, m in zip(fed.strategy.global_arrays, x, mean):
        np.testing.assert_allclose(got, start + 0.5 * (m - start), atol=1e-6)


def test_a_bad_control_change_is_rejected_and_the_round_goes_on() -> None:
    cfg = parse_run_config({"algorithm": "scaffold"})
    specs = [("body.w", (2,))]
    runner = hand_made_runner(cfg, specs, [np.zeros(2, np.float32)], {0: 10, 1: 10})
    runner.strategy.control_specs = specs
    runner.strategy.control = [np.zeros(2, np.float32)]

    def reply(model: float, control: float) -> RecordDict:
        return RecordDict(
            {
                "arrays": to_record(["body.w"], [np.full(2, model, np.float32)]),
                "control": to_record(["body.w"], [np.full(2, control, np.float32)]),
                "metrics": MetricRecord({"num-examples": 10, "train-loss": 0.5}),
            }
        )

    runner.aggregate_train(1, [FakeReply(100, reply(2.0, 4.0)), FakeReply(101, reply(9.0, np.nan))])
    np.testing.assert_allclose(runner.strategy.global_arrays[0], [2.0, 2.0])  # the NaN reply left out
    np.testing.assert_allclose(runner.strategy.control[0], [2.0, 2.0])  # 1/N = 1/2 of 4
    state = runner.strategy.state_dict()
    other = hand_made_runner(cfg, specs, [np.zeros(2, np.float32)], {0: 10, 1: 10}).strategy
    other.control_specs = specs
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.control[0], [2.0, 2.0])
    state["control"] = [np.full(3, 1.0)]
    with pytest.raises(ValueError, match="control variate does not match"):
        other.load_state_dict(state)


def test_settings_scaffold_cannot_honour_are_refused() -> None:
    with pytest.raises(ConfigError, match="no DP mechanism here clips or noises it"):
        parse_run_config({"algorithm": "scaffold", "dp": "local", "dp-noise-multiplier": 1.0})
    with pytest.raises(ConfigError, match="'optimizer' must be 'sgd'"):
        _federation(optimizer="adam")
    with pytest.raises(ConfigError, match="scaffold-server-lr"):
        parse_run_config({"algorithm": "scaffold", "scaffold-server-lr": 0})


def test_the_client_state_holds_c_i_across_rounds() -> None:
    fed = _federation()
    fed.train_round(1)
    first = fed.client(0).env.state.load_arrays(OWN_CONTROL)
    fed.train_round(2)
    second = fed.client(0).env.state.load_arrays(OWN_CONTROL)
    assert first is not None and second is not None
    assert any(not np.array_equal(a, b) for a, b in zip(first, second))
