"""Per-FedAvg: the meta-gradient of both variants against hand-derived gradients on a toy model, the batch split,
and the one personal step before evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from common.config import ConfigError, parse_run_config
from common.methods.perfedavg import batches_per_step, meta_loss

from .inprocess import InProcessFederation


def _toy() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Linear(3, 2), torch.randn(6, 3), torch.tensor([0, 1, 1, 0, 1, 0])


def _grads(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, **kw):
    return torch.autograd.grad(F.cross_entropy(functional_call(model, params, (x,)), y), list(params.values()), **kw)


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_the_meta_gradient_is_algorithm_ones(variant: str) -> None:
    model, x, y = _toy()
    alpha, parts = 0.3, batches_per_step(variant)
    xs, ys = torch.tensor_split(x, parts), torch.tensor_split(y, parts)
    w = {name: p.detach().clone().requires_grad_(True) for name, p in model.named_parameters()}
    g1 = _grads(model, w, xs[0], ys[0])
    adapted = {name: (p - alpha * g).detach().requires_grad_(True) for (name, p), g in zip(w.items(), g1)}
    expected = _grads(model, adapted, xs[1], ys[1])  # grad f(w - alpha grad f(w; D); D')
    if variant == "hf":  # minus alpha H(w; D'') v, H by differentiating the gradient twice
        g3 = _grads(model, w, xs[2], ys[2], create_graph=True)
        hv = torch.autograd.grad(sum((g * v).sum() for g, v in zip(g3, expected)), list(w.values()))
        expected = tuple(v - alpha * h for v, h in zip(expected, hv))
    loss = meta_loss(alpha, variant)(model, x, y)
    loss.backward()
    for param, want in zip(model.parameters(), expected):
        assert param.grad is not None
        torch.testing.assert_close(param.grad, want)
    with torch.no_grad():  # the value reported: f at the adapted weights on D'
        value = F.cross_entropy(functional_call(model, adapted, (xs[1],)), ys[1])
    torch.testing.assert_close(loss.detach(), value)


def test_a_batch_too_small_to_split_is_a_plain_step() -> None:
    model, x, y = _toy()
    torch.testing.assert_close(meta_loss(0.1, "hf")(model, x[:2], y[:2]), F.cross_entropy(model(x[:2]), y[:2]))


def _federation(**overrides) -> InProcessFederation:
    raw = {"algorithm": "perfedavg", "dataset": "digits", "num-rounds": 3, "fraction-train": 1.0, "local-epochs": 1}
    return InProcessFederation({**raw, "lr": 0.1, "batch-size": 16, **overrides}, 2)


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_a_round_takes_one_meta_step_per_parts_batches_and_evaluates_after_one_step(variant: str) -> None:
    fed = _federation(**{"perfedavg-variant": variant})
    replies = fed.train_round(1)
    for reply in replies.values():
        metrics = reply.metric_records["metrics"]
        samples = int(metrics["num-examples"])
        assert int(metrics["steps"]) == -(-samples // (16 * batches_per_step(variant)))
    metrics = fed.evaluate(1)[0].metric_records["metrics"]
    assert float(metrics["acc-shift-0"]) != float(metrics["global-acc-shift-0"])  # one step of alpha moved it
    assert np.isfinite(float(metrics["loss"]))


def test_bad_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match="perfedavg-alpha"):
        parse_run_config({"algorithm": "perfedavg", "perfedavg-alpha": 0})
    with pytest.raises(ConfigError, match="perfedavg-variant"):
        parse_run_config({"algorithm": "perfedavg", "perfedavg-variant": "maml"})
