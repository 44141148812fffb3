"""LG-FedAvg, FedPer, FedRep, FedBN, Ditto and APFL in-process: what travels, the update formulas on hand-made
tensors, FedRep's frozen parts, and their costs against FedAvg."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict
from torch import nn
from torch.nn import functional as F

from client_app.algorithms import base as client_base
from client_app.algorithms.apfl import ALPHA
from client_app.algorithms.local import PERSONAL
from common.config import ConfigError, parse_run_config
from common.learning.models import ModelLayout, build_model, get_arrays
from common.learning.train import TrainSettings, train
from common.methods.personal import Mixture, mixture_arrays, norm_entries, shared_names
from common.wire.records import to_record
from server_app.wire import wire_bytes

from .fakes import FakeReply, hand_made_runner, train_content
from .inprocess import InProcessFederation

MLP_NAMES = ["body.1.weight", "body.1.bias", "head.weight", "head.bias"]


def _federation(algorithm: str, num_clients: int = 4, **overrides) -> InProcessFederation:
    raw = {
        "algorithm": algorithm,
        "dataset": "digits",
        "num-rounds": 3,
        "fraction-train": 1.0,
        "local-epochs": 1,
        "lr": 0.1,
        **overrides,
    }
    return InProcessFederation(raw, num_clients)


def _names(content: RecordDict, key: str = "arrays") -> list[str]:
    return list(content.array_records[key].keys())


# ----- what travels ---------------------------------------------------------------------------------
def test_shared_names_of_each_part() -> None:
    norm = ["body.2.weight", "body.2.bias", "body.2.running_mean", "body.2.running_var", "body.2.num_batches_tracked"]
    names = ["body.1.weight", "body.1.bias", *norm, "head.weight", "head.bias"]
    assert shared_names(names, "head") == ["head.weight", "head.bias"]
    assert shared_names(names, "body") == ["body.1.weight", "body.1.bias", *norm]
    assert shared_names(names, "no-norm", norm) == ["body.1.weight", "body.1.bias", "head.weight", "head.bias"]
    assert shared_names(names, "all") == names
    with pytest.raises(ValueError, match="unknown shared part"):
        shared_names(names, "tail")
    assert norm_entries(build_model("mlp-bn", "digits", (64,), 10, seed=0)) == norm
    assert norm_entries(build_model("mlp", "digits", (64,), 10, seed=0)) == []


@pytest.mark.parametrize(
    ("algorithm", "expected"),
    [
        ("lg-fedavg", ["head.weight", "head.bias"]),
        ("fedper", ["body.1.weight", "body.1.bias"]),
        ("fedrep", ["body.1.weight", "body.1.bias"]),
        ("fedbn", ["body.1.weight", "body.1.bias", "head.weight", "head.bias"]),
    ],
)
def test_only_the_shared_part_travels_both_ways(algorithm: str, expected: list[str]) -> None:
    fed = _federation(algorithm)
    runner = fed.runner
    for message_type in ("train", "evaluate"):
        content = runner.message_contents(1, [0], message_type)[0]
        assert set(content.array_records) == {"arrays"} and _names(content) == expected, message_type
    replies = fed.train_round(1)
    assert all(_names(reply) == expected for reply in replies.values())
    assert fed.round_log.train["used"] == 4
    stored = fed.client(0).env.state.load_arrays(PERSONAL)
    assert stored is not None and len(stored) == len(fed.strategy.specs), "the whole model stays on the device"


def test_fedbn_never_sends_batch_norm_parameters_or_statistics() -> None:
    fed = _federation("fedbn")
    assert fed.cfg.model == "mlp-bn", "auto picks the dataset's model with batch norm for FedBN"
    norm = set(fed.strategy.shared) & {
        "body.2.weight",
        "body.2.bias",
        "body.2.running_mean",
        "body.2.running_var",
        "body.2.num_batches_tracked",
    }
    assert not norm
    replies = fed.train_round(1)
    fed.train_round(2)
    for reply in replies.values():
        assert not any(name.startswith("body.2.") for name in _names(reply))
    # each client's statistics are its own: two clients end with different running means
    means = [
        dict(zip([n for n, _ in fed.strategy.specs], fed.client(pid).env.state.load_arrays(PERSONAL)))[
            "body.2.running_mean"
        ]
        for pid in (0, 1)
    ]
    assert not np.array_equal(means[0], means[1])
    with pytest.raises(ConfigError, match="needs a model with them"):
        _federation("fedbn", model="mlp")


def test_partial_server_averages_only_the_shared_entries_and_rejects_the_rest() -> None:
    layout = ModelLayout.of(build_model("mlp", "digits", (64,), 10, seed=0))
    runner = hand_made_runner(
        parse_run_config({"algorithm": "lg-fedavg"}), layout.specs, layout.initial, {0: 10, 1: 30, 2: 30}
    )
    strategy = runner.strategy
    shapes = dict(strategy.specs)
    heads = [
        [np.full(shapes["head.weight"], v, np.float32), np.full(shapes["head.bias"], -v, np.float32)]
        for v in (1.0, 4.0)
    ]
    body_before = [a.copy() for a in strategy.global_arrays[:2]]
    whole = [np.zeros(shape, np.float32) for _, shape in strategy.specs]
    runner.aggregate_train(
        1,
        [
            FakeReply(100, train_content(["head.weight", "head.bias"], heads[0], 10)),
            FakeReply(101, train_content(["head.weight", "head.bias"], heads[1], 30)),
            FakeReply(102, train_content(MLP_NAMES, whole, 30)),
        ],
    )
    assert runner.round_log.train["used"] == 2 and runner.round_log.train["rejected"] == 1
    np.testing.assert_array_equal(strategy.global_arrays[2], np.full(shapes["head.weight"], 3.25, np.float32))
    assert all(np.array_equal(a, b) for a, b in zip(strategy.global_arrays[:2], body_before)), "body untouched"


def test_split_methods_send_fewer_bytes_than_fedavg() -> None:
    sizes = {}
    for algorithm in ("fedavg", "lg-fedavg", "fedper"):
        fed = _federation(algorithm)
        sizes[algorithm] = wire_bytes(fed.runner.message_contents(1, [0], "train")[0])
    # the MLP: body 64x128+128 = 8,320 parameters, head 128x10+10 = 1,290
    assert sizes["lg-fedavg"] < 0.2 * sizes["fedavg"] and sizes["fedper"] < sizes["fedavg"]


# ----- FedRep -------------------------------------------------------------------------------------
def test_fedrep_trains_the_head_with_the_body_frozen_then_the_body_with_the_head_frozen(monkeypatch) -> None:
    fed = _federation("fedrep")
    calls = []
    real_train = client_base.train  # the loop every client half calls through ClientAlgorithm.train_locally

    def spy(model, *args, trainable=None, **kwargs):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        stats = real_train(model, *args, trainable=trainable, **kwargs)
        changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
        calls.append((set(trainable), changed))
        return stats

    monkeypatch.setattr(client_base, "train", spy)
    reply = fed.client(0).fit(1, fed.runner.message_contents(1, [0], "train")[0])
    head, body = {"head.weight", "head.bias"}, {"body.1.weight", "body.1.bias"}
    assert calls == [(head, head), (body, body)], "head epochs first (body frozen), then body epochs (head frozen)"
    assert _names(reply) == sorted(body, reverse=True)


# ----- Ditto -----------------------------------------------------------------------------------------
def test_ditto_personal_update_equals_the_formula() -> None:
    lam, lr = 0.7, 0.1
    fed = _federation("ditto", 2, **{"ditto-lambda": lam, "batch-size": 10_000, "lr": lr})
    client = fed.client(0)
    rng = np.random.default_rng(0)
    w = [a + 0.1 * rng.standard_normal(a.shape).astype(np.float32) for a in fed.strategy.global_arrays]
    v0 = [a + 0.3 * rng.standard_normal(a.shape).astype(np.float32) for a in fed.strategy.global_arrays]
    client.env.state.save_arrays(PERSONAL, v0)
    content = RecordDict(
        {"arrays": to_record([n for n, _ in fed.strategy.specs], w), "config": ConfigRecord({"server-round": 1})}
    )
    reply = client.fit(1, content)  # one full-batch SGD step on w and one on v
    model = client.new_model()
    for p, value in zip(model.parameters(), v0):
        p.data = torch.from_numpy(value.copy())
    data = client.env.data
    F.cross_entropy(model(data.train_x), data.train_y).backward()
    expected = [value - lr * (p.grad.numpy() + lam * (value - ref)) for p, value, ref in zip(model.parameters(), v0, w)]
    got = client.env.state.load_arrays(PERSONAL)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-6)
    fedavg_flops = _federation("fedavg", 2, **{"batch-size": 10_000}).client(0).fit(1, content)
    assert reply.metric_records["metrics"]["train-flops"] == pytest.approx(
        2 * fedavg_flops.metric_records["metrics"]["train-flops"]
    ), "Ditto trains two models: 2x FedAvg's FLOPs"


def test_ditto_and_apfl_report_personal_and_global_rows() -> None:
    for algorithm in ("ditto", "apfl"):
        fed = _federation(algorithm)
        fed.train_round(1)
        fed.evaluate(1)
        mean = fed.round_log.eval["mean"]
        assert 0 <= mean["acc-shift-0"] <= 1 and 0 <= mean["global-acc-shift-1"] <= 1, algorithm


# ----- APFL ----------------------------------------------------------------------------------------
def test_apfl_alpha_gradient_step_on_a_hand_made_case() -> None:
    personal = nn.Linear(2, 2)
    with torch.no_grad():
        personal.weight.copy_(torch.tensor([[1.0, -1.0], [0.5, 2.0]]))
        personal.bias.copy_(torch.tensor([0.1, -0.2]))
    shared = {"weight": torch.tensor([[0.0, 1.0], [1.0, 0.0]]), "bias": torch.tensor([0.3, 0.3])}
    alpha, lr = 0.4, 0.05
    x, y = torch.tensor([[1.0, 2.0], [-1.0, 0.5]]), torch.tensor([0, 1])
    # by hand: the mixed model's gradient g, then dL/dalpha = <g, v - w>, dL/dv = alpha * g
    mixed = nn.Linear(2, 2)
    with torch.no_grad():
        for name, p in mixed.named_parameters():
            p.copy_(alpha * dict(personal.named_parameters())[name] + (1 - alpha) * shared[name])
    F.cross_entropy(mixed(x), y).backward()
    grads = dict(mixed.named_parameters())
    v = {n: p.detach().clone() for n, p in personal.named_parameters()}
    d_alpha = sum(float((grads[n].grad * (v[n] - shared[n])).sum()) for n in v)
    mixture = Mixture(personal, shared, alpha)
    train(mixture, x, y, TrainSettings(epochs=1, batch_size=2, lr=lr), torch.Generator().manual_seed(0))
    assert mixture.clamped_alpha() == pytest.approx(alpha - lr * d_alpha, abs=1e-6)
    for n, p in personal.named_parameters():
        torch.testing.assert_close(p.detach(), v[n] - lr * alpha * grads[n].grad, rtol=0, atol=1e-6)


def test_apfl_keeps_alpha_and_evaluates_the_mixture() -> None:
    fed = _federation("apfl", 2, **{"apfl-alpha": 0.3})
    fed.train_round(1)
    state = fed.client(0).env.state
    alpha = float(state.load_named(ALPHA)["alpha"][0])
    assert 0.0 <= alpha <= 1.0 and alpha != 0.3, "alpha is learned and kept"
    v, w = state.load_arrays(PERSONAL), fed.strategy.global_arrays
    mixed = mixture_arrays(v, w, alpha, [True] * len(v))
    np.testing.assert_allclose(mixed[0], alpha * v[0] + (1 - alpha) * w[0], rtol=1e-6)
    client = fed.client(0)
    model = client.mixed(
        client.stored_model(PERSONAL),
        client.received_model(RecordDict({"arrays": to_record([n for n, _ in fed.strategy.specs], w)})),
        alpha,
    )
    np.testing.assert_allclose(get_arrays(model)[0], mixed[0], rtol=1e-6)


@pytest.mark.parametrize(
    ("algorithm", "stages"),
    [
        ("lg-fedavg", {"L1", "L2"}),
        ("fedper", {"L1", "L2"}),
        ("fedrep", {"L1", "L2"}),
        ("fedbn", {"L1", "L2"}),
        ("ditto", {"G", "L1", "L2"}),
        ("apfl", {"G", "L1", "L2"}),
    ],
)
def test_stages_reported_as_they_apply(algorithm: str, stages: set[str]) -> None:
    fed = _federation(algorithm, 2, stages=True, **{"stage-test-size": 50})
    fed.train_round(1)
    assert set(fed.round_log.train["stages"]) == stages


@pytest.mark.parametrize("algorithm", ["fedavg", "dmpfl", "fedamp"])
def test_full_models_with_batch_norm_travel_with_their_scalar_entries(algorithm: str) -> None:
    record = to_record(["n"], [np.array(3.0, np.float32)])
    assert record["n"].numpy().shape == (), "a 0-d entry (num_batches_tracked) stays 0-d on the wire"
    fed = _federation(algorithm, model="mlp-bn", iterations=1)
    for rnd in (1, 2):
        fed.train_round(rnd)
        assert fed.round_log.train["used"] == 4 and fed.round_log.train["rejected"] == 0
