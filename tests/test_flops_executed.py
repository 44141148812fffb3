"""Training FLOPs as executed: each layer's forward, input-gradient and weight-gradient parts from torch's counter,
masked passes under both weight-gradient conventions, DM-PFL's phase 3, and the dense-gradient figure's way from
the client's reply to the tables."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from client_app.algorithms.dmpfl import PERSONAL
from common.learning.flops import UNATTRIBUTED, LayerFlops, executed_per_sample, layer_flops, layer_parts
from common.learning.models import build_model
from common.methods.masks import erk_densities, prunable_names
from common.wire.messages import NUM_EXAMPLES, TRAIN_FLOPS, TRAIN_FLOPS_DENSE_GRAD
from experiments.analysis.collect import Run
from experiments.analysis.tables import RATIOS, metric_reader
from server_app.replies import reply_flops
from server_app.results import summarize

from .fakes import metrics_only
from .inprocess import InProcessFederation

SHAPE = (3, 12, 12)
BATCH = 8


class Small(nn.Module):
    """Two convolutions, a hidden linear layer and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
        self.fc = nn.Linear(6 * 5 * 5, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits."""
        x = torch.max_pool2d(torch.relu(self.conv2(torch.relu(self.conv1(x)))), 2)
        return self.head(torch.relu(self.fc(x.flatten(1))))


def _small() -> Small:
    torch.manual_seed(0)
    return Small()


def _by_weight(parts: tuple[LayerFlops, ...]) -> dict[str, LayerFlops]:
    return {part.weight: part for part in parts}


def _counted(model: nn.Module, trainable: set[str] | None = None, shape: tuple[int, ...] = SHAPE) -> float:
    return layer_flops(model, shape, 10, BATCH, trainable)[0]


def test_parts_add_up_to_the_counter_per_module_and_in_all() -> None:
    model = _small()
    parts = _by_weight(layer_parts(model, SHAPE, 10, BATCH))
    assert list(parts) == ["conv1.weight", "conv2.weight", "fc.weight", "head.weight"]
    total, per_module = layer_flops(model, SHAPE, 10, BATCH)
    with FlopCounterMode(display=False) as forward_only:
        model(torch.zeros(BATCH, *SHAPE))
    forward = forward_only.get_flop_counts()
    for name, part in parts.items():
        module = f"Small.{name.rsplit('.', 1)[0]}"
        assert part.forward == sum(forward[module].values()) > 0
        executed_input = part.input_grad if name != "conv1.weight" else 0.0  # the data needs no gradient
        assert part.forward + executed_input + part.weight_grad == per_module[module]
    assert parts["conv1.weight"].upstream == frozenset()
    assert parts["fc.weight"].upstream == {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"}
    assert sum(p.forward + p.input_grad + p.weight_grad for p in parts.values()) - parts["conv1.weight"].input_grad == (
        total
    )
    assert executed_per_sample(list(parts.values()), batch_size=BATCH) * BATCH == total


def test_a_weight_gradient_is_what_freezing_its_layer_saves() -> None:
    model = _small()
    parts = layer_parts(model, SHAPE, 10, BATCH)
    every = {name for name, _ in model.named_parameters()}
    total = _counted(model)
    for part, after in zip(parts, [*parts[1:], None]):
        layer = part.weight.rsplit(".", 1)[0]
        assert part.weight_grad == total - _counted(model, every - {part.weight}) > 0
        saved = total - _counted(model, {name for name in every if name.rsplit(".", 1)[0] != layer})
        if layer == "conv1":  # nothing before conv2 trains then: its input gradient goes too
            assert after is not None and saved == part.weight_grad + after.input_grad
        else:
            assert saved == part.weight_grad
        # all its weights active, none updated (sparse convention): the counter's count with that weight frozen
        kept = {part.weight: 1.0}
        assert executed_per_sample(parts, kept, {part.weight: 0.0}, batch_size=BATCH) * BATCH == total - (
            part.weight_grad
        )


@pytest.mark.parametrize("model_name", ["cnn-cifar", "resnet10-s", "dnn-har-bn"])
def test_trainable_subsets_match_the_counter_on_the_whole_model(model_name: str) -> None:
    shape = (9, 128) if model_name.startswith("dnn-har") else (3, 32, 32)
    model = build_model(model_name, "har" if shape == (9, 128) else "cifar10", shape, 10, seed=0)
    parts = layer_parts(model, shape, 10, BATCH)
    every = [name for name, _ in model.named_parameters()]
    head = {name for name in every if name.startswith("head.")}
    rng = random.Random(0)
    subsets = [None, head, set(every) - head, set(prunable_names(model))]
    subsets += [set(rng.sample(every, rng.randint(1, 3))) for _ in range(6)]
    for trainable in subsets:
        assert executed_per_sample(parts, trainable=trainable, batch_size=BATCH) * BATCH == _counted(
            model, trainable, shape
        ), sorted(trainable or ())


def test_masked_pass_scales_forward_and_input_gradient_by_active_and_weight_gradient_by_convention() -> None:
    model = _small()
    parts = layer_parts(model, SHAPE, 10, BATCH)
    total = _counted(model)
    ones = {part.weight: 1.0 for part in parts}
    assert executed_per_sample(parts, ones, batch_size=BATCH) * BATCH == total
    assert executed_per_sample(parts, ones, dense_grad=True, batch_size=BATCH) * BATCH == total
    conv2 = _by_weight(parts)["conv2.weight"]
    f, i, w = conv2.forward, conv2.input_grad, conv2.weight_grad
    rest = total - (f + i + w)
    sparse = executed_per_sample(parts, {"conv2.weight": 0.5}, {"conv2.weight": 0.1}, batch_size=BATCH) * BATCH
    dense = executed_per_sample(parts, {"conv2.weight": 0.5}, {"conv2.weight": 0.1}, None, True, BATCH) * BATCH
    assert sparse == pytest.approx(rest + 0.5 * f + 0.5 * i + 0.1 * w, rel=1e-15)
    assert dense == pytest.approx(rest + 0.5 * f + 0.5 * i + w, rel=1e-15)
    assert dense - sparse == pytest.approx(0.9 * w, rel=1e-12)


def test_updated_defaults_to_active_bit_for_bit_as_the_whole_layer_scaled() -> None:
    model = build_model("cnn-cifar", "cifar10", (3, 32, 32), 10, seed=0)
    parts = layer_parts(model, (3, 32, 32), 10, BATCH)
    total = _counted(model, shape=(3, 32, 32))
    rng = random.Random(3)
    for _ in range(20):
        active = {name: rng.random() for name in sorted(prunable_names(model))}
        scaled = total  # each layer's whole count (forward and backward) scaled by its density
        for part in parts:
            scaled -= (1.0 - active[part.weight]) * (
                part.forward + part.input_grad * bool(part.upstream) + part.weight_grad
            )
        assert executed_per_sample(parts, active, batch_size=BATCH) == scaled / BATCH
        assert executed_per_sample(parts, active, dict(active), batch_size=BATCH) == scaled / BATCH
        assert executed_per_sample(parts, active, dense_grad=True, batch_size=BATCH) > scaled / BATCH


def test_phase3_costs_at_least_the_forward_of_theta_c() -> None:
    model = build_model("cnn-cifar", "cifar10", (3, 32, 32), 10, seed=0)
    parts = layer_parts(model, (3, 32, 32), 10, BATCH)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters() if name in prunable_names(model)}
    m_c = erk_densities(shapes, 0.5)
    own = {name: 0.03 * d for name, d in m_c.items()}
    trainable = set(prunable_names(model))
    phase3 = executed_per_sample(parts, m_c, own, trainable, batch_size=BATCH)
    forward_c = sum(m_c[p.weight] * p.forward for p in parts) / BATCH
    old = executed_per_sample(parts, own, batch_size=BATCH)  # everything scaled by the personal-only density
    assert phase3 > forward_c > 10 * old
    dense = executed_per_sample(parts, m_c, own, trainable, dense_grad=True, batch_size=BATCH)
    assert dense - phase3 == pytest.approx(sum((1 - own[p.weight]) * p.weight_grad for p in parts) / BATCH)


def test_flops_outside_weighted_modules_are_one_part_counted_whole(caplog: pytest.LogCaptureFixture) -> None:
    class Functional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.extra = nn.Parameter(torch.ones(4, 10))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.flatten(1)) @ self.extra

    model = Functional()
    with caplog.at_level("WARNING", logger="common.learning.flops"):
        parts = layer_parts(model, (4,), 10, BATCH)
    counted, _ = layer_flops(model, (4,), 10, BATCH)
    extra = 3 * 2 * BATCH * 4 * 10  # the product with `extra`: its forward and the gradients of its two operands
    assert [p.weight for p in parts] == ["fc.weight", UNATTRIBUTED]
    assert parts[1].forward == extra and executed_per_sample(parts, batch_size=BATCH) * BATCH == counted
    assert "outside the per-layer parts" in caplog.text
    # counted whole under any mask: a mask on fc leaves the unattributed part as it is
    halved = executed_per_sample(parts, {"fc.weight": 0.5}, batch_size=BATCH) * BATCH
    assert halved == pytest.approx(extra + 0.5 * (parts[0].forward + parts[0].weight_grad))


def test_the_reply_sends_dense_gradient_flops_only_where_they_differ_and_the_server_sums_them() -> None:
    fed = InProcessFederation({"algorithm": "fedavg", "dataset": "digits", "local-epochs": 1}, 2)
    replies = fed.train_round(1)
    assert all(TRAIN_FLOPS_DENSE_GRAD not in r.metric_records["metrics"] for r in replies.values())
    assert fed.round_log.train["flops_dense_grad"] == fed.round_log.train["flops"] > 0

    raw = {"algorithm": "dmpfl", "dataset": "digits", "num-rounds": 6, "iterations": 1, "fraction-train": 0.5}
    fed = InProcessFederation({**raw, "local-epochs": 1, "readjust-ratio": 0.2}, 4)
    model = build_model(fed.cfg.model, fed.cfg.dataset, fed.data[0].input_shape, 10, seed=0)
    parts = layer_parts(model, fed.data[0].input_shape, 10)
    for rnd in range(1, 7):
        replies = fed.train_round(rnd)
        metrics = {pid: r.metric_records["metrics"] for pid, r in replies.items()}
        assert all(m[TRAIN_FLOPS_DENSE_GRAD] > m[TRAIN_FLOPS] > 0 for m in metrics.values())
        assert fed.round_log.train["flops_dense_grad"] == pytest.approx(
            sum(m[TRAIN_FLOPS_DENSE_GRAD] for m in metrics.values())
        )
    for pid, m in metrics.items():  # the last round is a phase 3: theta_c's mask active, its own positions updated
        client = fed.client(pid)
        _, m_c = client.load_sparse(PERSONAL)
        m_g = fed.strategy.global_masks
        active = {n: float(np.mean(m_c[n])) for n in sorted(m_c)}
        own = {n: float(np.mean(m_c[n] & ~m_g[n])) for n in sorted(m_c)}
        per_sample = executed_per_sample(parts, active, own, set(m_c))
        assert m[TRAIN_FLOPS] == pytest.approx(per_sample * m[NUM_EXAMPLES])
        assert m[TRAIN_FLOPS] > sum(active[p.weight] * p.forward for p in parts) / BATCH * m[NUM_EXAMPLES]


def test_dense_gradient_flops_fall_back_to_train_flops_up_to_the_tables() -> None:
    assert reply_flops(metrics_only(**{TRAIN_FLOPS: 5.0}), dense_grad=True) == 5.0
    assert reply_flops(metrics_only(**{TRAIN_FLOPS: 5.0, TRAIN_FLOPS_DENSE_GRAD: 8.0}), dense_grad=True) == 8.0
    assert reply_flops(metrics_only(**{TRAIN_FLOPS: 5.0, TRAIN_FLOPS_DENSE_GRAD: 8.0})) == 5.0
    bytes_ = {"train_down": 0, "train_up": 0, "eval_down": 0, "eval_up": 0}
    records = [
        {"round": 1, "wall_s": 1.0, "bytes": bytes_, "train": {"used": 1, "sent": 1, "flops": 10.0}},
        {"round": 2, "wall_s": 1.0, "bytes": bytes_, "train": {"used": 1, "sent": 1, "flops": 10.0}},
    ]
    records[1]["train"]["flops_dense_grad"] = 30.0
    summary = summarize(records, {"num_clients": 4})
    assert summary["train_flops_dense_grad_total"] == 40.0 and summary["train_flops_dense_grad_per_client"] == 10.0
    assert summary["train_flops_per_client"] == 5.0
    read = metric_reader("flops-dense-grad")
    assert read(Run(Path("x"), {}, summary, records)) == 10.0
    assert read(Run(Path("x"), {}, {"train_flops_per_client": 5.0}, [])) == 5.0
    assert RATIOS["flops-dense-grad-ratio"] == "flops-dense-grad"


def test_bytes_with_evaluation_add_the_evaluation_messages() -> None:
    summary = {"mb_per_client": {"train_down": 1.0, "train_up": 2.0, "eval_down": 4.0, "eval_up": 8.0}}
    run = Run(Path("x"), {}, summary, [])
    assert metric_reader("mb")(run) == 3.0 and metric_reader("mb-all")(run) == 15.0
    assert RATIOS["mb-all-ratio"] == "mb-all"
