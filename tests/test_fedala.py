"""FedALA: one weight-learning step against the update rule by hand, the lower layers from the global model, the
start phase's stopping rule, normalization statistics left alone, and the weights kept by training only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from client_app.algorithms.fedala import LOCAL, WEIGHTS
from common.config import ConfigError, parse_run_config
from common.methods.fedala import ALASettings, adaptive_local_aggregation, mix, top_names

from .inprocess import InProcessFederation


def _two_layers() -> tuple[nn.Module, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    local = {name: torch.randn_like(p) for name, p in model.named_parameters()}
    received = {name: torch.randn_like(p) for name, p in model.named_parameters()}
    return model, local, received


def test_one_epoch_of_weight_learning_is_the_update_rule() -> None:
    model, local, received = _two_layers()
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    top = top_names(model, 2)
    assert top == ["2.weight", "2.bias"]
    weights = {name: torch.full_like(local[name], 0.5) for name in top}
    # by hand: the lower layer from the global model, the top mixed at W; g at the mix; W <- clip(W - eta g (G - L))
    mixed = {
        name: received[name] if name not in top else mix(local[name], received[name], weights[name]) for name in local
    }
    live = {name: v.clone().requires_grad_(name in top) for name, v in mixed.items()}
    hidden = F.relu(F.linear(x, live["0.weight"], live["0.bias"]))
    loss = F.cross_entropy(F.linear(hidden, live["2.weight"], live["2.bias"]), y)
    grads = dict(zip(top, torch.autograd.grad(loss, [live[n] for n in top])))
    eta = 3.0
    want = {n: torch.clamp(weights[n] - eta * grads[n] * (received[n] - local[n]), 0, 1) for n in top}
    settings = ALASettings(eta=eta, batch_size=5, threshold=0.1, max_start_epochs=100)
    learned, epochs = adaptive_local_aggregation(model, local, received, weights, top, x, y, settings)
    assert epochs == 1  # after the start phase: one epoch
    params = dict(model.named_parameters())
    for name in top:
        torch.testing.assert_close(learned[name], want[name])
        torch.testing.assert_close(params[name].detach(), mix(local[name], received[name], want[name]))
    torch.testing.assert_close(params["0.weight"].detach(), received["0.weight"])
    assert all(p.requires_grad for p in model.parameters())  # left trainable


@pytest.mark.parametrize(("threshold", "epochs"), [(1e9, 11), (0.0, 7)])
def test_the_start_phase_stops_when_losses_settle_or_at_its_bound(threshold: float, epochs: int) -> None:
    model, local, received = _two_layers()
    x, y = torch.randn(6, 3), torch.tensor([0, 1, 1, 0, 1, 0])
    settings = ALASettings(eta=1.0, batch_size=3, threshold=threshold, max_start_epochs=7 if threshold == 0 else 50)
    learned, took = adaptive_local_aggregation(model, local, received, None, ["2.weight", "2.bias"], x, y, settings)
    assert took == epochs and all(torch.all((w >= 0) & (w <= 1)) for w in learned.values())


def test_normalization_statistics_are_put_back() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    local = {name: torch.randn_like(p) for name, p in model.named_parameters()}
    received = {name: torch.randn_like(p) for name, p in model.named_parameters()}
    before = {name: b.clone() for name, b in model.named_buffers()}
    settings = ALASettings(eta=1.0, batch_size=4, threshold=0.1, max_start_epochs=3)
    adaptive_local_aggregation(
        model, local, received, None, ["2.weight", "2.bias"], torch.randn(8, 3), torch.zeros(8).long(), settings
    )
    for name, buffer in model.named_buffers():
        torch.testing.assert_close(buffer, before[name])


def test_training_keeps_the_model_and_weights_evaluation_keeps_nothing() -> None:
    raw = {"algorithm": "fedala", "dataset": "digits", "num-rounds": 3, "fraction-train": 1.0, "local-epochs": 1}
    fed = InProcessFederation({**raw, "lr": 0.1, "batch-size": 32, "fedala-max-start-epochs": 12}, 2)
    fed.train_round(1)
    first = fed.state(0)
    assert LOCAL in first and WEIGHTS not in first  # round 1: nothing to mix yet (the authors' first round)
    fed.train_round(2)
    second = fed.state(0)
    assert WEIGHTS in second
    fed.evaluate(2)
    after = fed.state(0)
    for key in (LOCAL, WEIGHTS):
        assert np.array_equal(
            np.concatenate([np.ravel(a) for a in _leaves(after[key])]),
            np.concatenate([np.ravel(a) for a in _leaves(second[key])]),
        )
    metrics = fed.evaluate(2)[0].metric_records["metrics"]
    assert float(metrics["acc-shift-0"]) != float(metrics["global-acc-shift-0"])


def _leaves(tree: object) -> list[np.ndarray]:
    if isinstance(tree, dict):
        return [leaf for key in sorted(tree) for leaf in _leaves(tree[key])]
    if isinstance(tree, (list, tuple)):
        return [leaf for item in tree for leaf in _leaves(item)]
    return [np.asarray(tree)]


def test_bad_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match="fedala-rand-percent"):
        parse_run_config({"algorithm": "fedala", "fedala-rand-percent": 0})
    with pytest.raises(ConfigError, match="fedala-eta"):
        parse_run_config({"algorithm": "fedala", "fedala-eta": 0})
