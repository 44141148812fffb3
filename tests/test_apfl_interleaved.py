"""APFL's local steps follow Algorithm 1 of the APFL paper: on each minibatch w, v and alpha move together, the
mixture alpha v + (1 - alpha) w built from the live local w (its values only), checked against plain torch."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from client_app.algorithms import ClientAlgorithm
from client_app.algorithms.apfl import ALPHA, APFLClient
from client_app.algorithms.local import PERSONAL
from common.learning.train import TrainSettings, TrainStats, train
from common.methods.personal import InterleavedMixture
from common.wire.records import to_record

from .inprocess import InProcessFederation

Params = dict[str, torch.Tensor]


def _grad(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor) -> Params:
    """Gradient of the cross-entropy of `model` run with `params` on (x, y)."""
    live = {name: p.detach().clone().requires_grad_(True) for name, p in params.items()}
    loss = F.cross_entropy(functional_call(model, live, (x,)), y)
    return dict(zip(live, torch.autograd.grad(loss, list(live.values()))))


def _algorithm_1_step(
    model: nn.Module, w: Params, v: Params, alpha: float, lr: float, x: torch.Tensor, y: torch.Tensor
) -> tuple[Params, Params, float]:
    """One local step of APFL's Algorithm 1 by its formulas: w <- w - lr g(w); with g the gradient at the mixture
    alpha v + (1 - alpha) w of this step's w, v <- v - lr alpha g and alpha <- alpha - lr <g, v - w>, in [0, 1]."""
    g_w = _grad(model, w, x, y)
    mixed = {name: alpha * v[name] + (1 - alpha) * w[name] for name in v}
    g = _grad(model, mixed, x, y)
    d_alpha = sum(float((g[name] * (v[name] - w[name])).sum()) for name in v)
    new_w = {name: w[name] - lr * g_w[name] for name in w}
    new_v = {name: v[name] - lr * alpha * g[name] for name in v}
    return new_w, new_v, float(np.clip(alpha - lr * d_alpha, 0.0, 1.0))


# ----- the module through the shared training loop ------------------------------------------------------------
def _linear(weight: list[list[float]], bias: list[float]) -> nn.Linear:
    layer = nn.Linear(len(weight[0]), len(weight))
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight))
        layer.bias.copy_(torch.tensor(bias))
    return layer


def test_one_optimizer_step_is_one_step_of_algorithm_1() -> None:
    local = _linear([[0.2, -0.4, 0.1], [0.5, 0.3, -0.2]], [0.05, -0.1])
    personal = _linear([[1.0, -1.0, 0.5], [-0.5, 2.0, 0.0]], [0.1, -0.2])
    x = torch.tensor([[1.0, 2.0, 0.0], [-1.0, 0.5, 1.5], [0.3, -2.0, 1.0], [2.0, 1.0, -1.0]])
    y = torch.tensor([0, 1, 1, 0])
    alpha, lr, seed = 0.4, 0.3, 7
    w = {n: p.detach().clone() for n, p in local.named_parameters()}
    v = {n: p.detach().clone() for n, p in personal.named_parameters()}
    order = torch.randperm(4, generator=torch.Generator().manual_seed(seed))  # the loop's shuffle of its one epoch
    for batch in (order[:2], order[2:]):
        w, v, alpha = _algorithm_1_step(local, w, v, alpha, lr, x[batch], y[batch])

    module = InterleavedMixture(local, personal, 0.4)
    stats = train(
        module,
        x,
        y,
        TrainSettings(epochs=1, batch_size=2, lr=lr),
        torch.Generator().manual_seed(seed),
        extra_losses=[module.mixture_loss],
    )
    assert stats.steps == 2
    for name, p in local.named_parameters():
        torch.testing.assert_close(p.detach(), w[name], rtol=0, atol=1e-6)
    for name, p in personal.named_parameters():
        torch.testing.assert_close(p.detach(), v[name], rtol=0, atol=1e-6)
    assert module.clamped_alpha() == pytest.approx(alpha, abs=1e-6)
    assert alpha != pytest.approx(0.4, abs=1e-3), "the case moves alpha"


def test_alpha_is_projected_onto_0_1_after_every_step() -> None:
    local = _linear([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], [0.0, 0.0])
    personal = _linear([[3.0, 0.0, 0.0], [-3.0, 0.0, 0.0]], [0.0, 0.0])
    x, y = torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([0])  # v fits this sample, w does not: alpha grows
    module = InterleavedMixture(local, personal, 0.95)
    settings = TrainSettings(epochs=1, batch_size=1, lr=100.0)
    train(module, x, y, settings, torch.Generator().manual_seed(0), extra_losses=[module.mixture_loss])
    assert float(module.alpha.detach()) > 1.0, "the raw step overshoots"
    logits = module.mixture_logits(x)
    assert float(module.alpha.detach()) == 1.0, "and is projected back before the next use"
    torch.testing.assert_close(logits, personal(x))


# ----- the client half ------------------------------------------------------------------------------------------
def _apfl_client(client_class: type[ClientAlgorithm] = APFLClient) -> tuple[ClientAlgorithm, InProcessFederation]:
    """An APFL client half on four hand-made samples, trained in full batches (so one step per local epoch)."""
    raw = {"algorithm": "apfl", "dataset": "digits", "local-epochs": 2, "batch-size": 10_000, "lr": 0.1}
    fed = InProcessFederation(raw, 2)
    gen = torch.Generator().manual_seed(3)
    data = fed.data[0]
    x = torch.randn(4, *data.input_shape, generator=gen)
    fed.data[0] = dataclasses.replace(data, train_x=x, train_y=torch.tensor([0, 3, 3, 7]))
    return client_class(fed.client(0).env), fed


def check_client_follows_algorithm_1(client_class: type[ClientAlgorithm] = APFLClient) -> None:
    """Two local steps of the client equal two steps of Algorithm 1 (w uploaded; v and alpha kept)."""
    client, fed = _apfl_client(client_class)
    names = [n for n, _ in fed.strategy.specs]
    rng = np.random.default_rng(0)
    w0 = [a + 0.1 * rng.standard_normal(a.shape).astype(np.float32) for a in fed.strategy.global_arrays]
    v0 = [a + 0.1 * rng.standard_normal(a.shape).astype(np.float32) for a in fed.strategy.global_arrays]
    client.env.state.save_arrays(PERSONAL, v0)
    client.env.state.save_named(ALPHA, {"alpha": np.array([0.6], np.float64)})
    content = RecordDict({"arrays": to_record(names, w0), "config": ConfigRecord({"server-round": 1})})
    reply = client.fit(1, content)

    model, data, lr = client.new_model(), client.env.data, 0.1
    w = {n: torch.from_numpy(a.copy()) for n, a in zip(names, w0)}
    v = {n: torch.from_numpy(a.copy()) for n, a in zip(names, v0)}
    alpha, losses = 0.6, []
    for _ in range(2):
        losses.append(float(F.cross_entropy(functional_call(model, w, (data.train_x,)), data.train_y)))
        w, v, alpha = _algorithm_1_step(model, w, v, alpha, lr, data.train_x, data.train_y)

    assert 0.0 < alpha < 1.0, "an alpha inside [0, 1], so the projection hides no difference"
    uploaded = reply.array_records["arrays"]
    for name in names:
        np.testing.assert_allclose(uploaded[name].numpy(), w[name].numpy(), rtol=0, atol=1e-5, err_msg=name)
    kept_alpha = float(client.env.state.load_named(ALPHA)["alpha"][0])
    assert kept_alpha == pytest.approx(alpha, abs=1e-5), f"alpha {kept_alpha} != Algorithm 1's {alpha}"
    for name, kept in zip(names, client.env.state.load_arrays(PERSONAL)):
        np.testing.assert_allclose(kept, v[name].numpy(), rtol=0, atol=1e-5, err_msg=name)
    metrics = reply.metric_records["metrics"]
    assert metrics["steps"] == 2, "one pass over the data per local epoch updates all three"
    assert metrics["train-loss"] == pytest.approx(float(np.mean(losses)), rel=1e-5), "w's own loss, as FedAvg's"


def test_client_update_follows_algorithm_1() -> None:
    check_client_follows_algorithm_1()


def test_client_counts_two_trainings_per_step() -> None:
    client, fed = _apfl_client()
    metrics = client.fit(1, fed.runner.message_contents(1, [0], "train")[0]).metric_records["metrics"]
    one_model = client.train_flops(TrainStats(num_samples=4, steps=2, mean_loss=0.0))
    assert one_model > 0 and metrics["train-flops"] == pytest.approx(2 * one_model), "w's pass and the mixture's"
