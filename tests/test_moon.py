"""MOON: the model-contrastive loss on hand-made vectors, what reaches the gradient, the previous model kept on the
device, and mu = 0 giving FedAvg's upload bit for bit."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from client_app.algorithms.moon import PREVIOUS
from common.learning.train import LossContext
from common.methods.moon import contrastive_loss, model_contrastive

from .inprocess import InProcessFederation


def test_the_contrastive_loss_on_hand_made_vectors() -> None:
    z = torch.tensor([[1.0, 0.0]])
    same, orthogonal = torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 3.0]])
    # cos(z, z_glob) = 1, cos(z, z_prev) = 0, tau 0.5: -log(e^2 / (e^2 + e^0)) = log(1 + e^-2)
    assert math.isclose(float(contrastive_loss(z, same, orthogonal, 0.5)), math.log(1 + math.exp(-2)), rel_tol=1e-6)
    assert math.isclose(float(contrastive_loss(z, same, same, 0.5)), math.log(2), rel_tol=1e-6)  # no preference
    tiny = contrastive_loss(z, orthogonal, same, 1e-4)  # a huge logit: finite, about 1 / tau
    assert torch.isfinite(tiny) and math.isclose(float(tiny), 1e4, rel_tol=1e-3)


def test_the_term_trains_the_model_and_leaves_the_fixed_bodies_alone() -> None:
    torch.manual_seed(0)
    body, global_body, previous_body = nn.Linear(3, 4), nn.Linear(3, 4), nn.Linear(3, 4)
    x = torch.randn(5, 3)
    term = model_contrastive(global_body, previous_body, mu=2.0, tau=0.5)
    features = body(x)
    loss = term(LossContext(body, x, torch.zeros(5, dtype=torch.long), features, features))
    with torch.no_grad():
        expected = 2.0 * contrastive_loss(features, global_body(x), previous_body(x), 0.5)
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert body.weight.grad is not None and float(body.weight.grad.abs().sum()) > 0
    assert global_body.weight.grad is None and previous_body.weight.grad is None


def _federation(**overrides) -> InProcessFederation:
    raw = {"dataset": "digits", "num-rounds": 3, "fraction-train": 1.0, "local-epochs": 1, "lr": 0.1}
    return InProcessFederation({**raw, **overrides}, 2)


def test_moon_keeps_its_trained_model_and_with_mu_zero_uploads_fedavgs() -> None:
    moon = _federation(algorithm="moon")
    replies = moon.train_round(1)
    names = [name for name, _ in moon.strategy.specs]
    for pid, reply in replies.items():
        kept = moon.client(pid).env.state.load_arrays(PREVIOUS)
        assert kept is not None
        for name, array in zip(names, kept):
            np.testing.assert_array_equal(array, reply.array_records["arrays"][name].numpy())
    plain = _federation(algorithm="fedavg").train_round(1)
    off = _federation(algorithm="moon", **{"moon-mu": 0.0}).train_round(1)
    for pid in plain:
        for name in names:
            a, b = plain[pid].array_records["arrays"][name].numpy(), off[pid].array_records["arrays"][name].numpy()
            np.testing.assert_array_equal(a, b)
    assert len(moon.train_round(2)) == 2  # round 2 contrasts against round 1's kept model
    assert float(replies[0].metric_records["metrics"]["train-flops"]) > float(
        plain[0].metric_records["metrics"]["train-flops"]
    )
