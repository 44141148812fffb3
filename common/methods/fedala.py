"""FedALA's adaptive local aggregation as plain torch (Zhang et al., "FedALA: Adaptive Local Aggregation for
Personalized Federated Learning", AAAI 2023, Sec. 4 and Algorithm 1; details from the authors' ALA module, as in
TsingZ0/FedALA and PFLlib)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

CONVERGED_WINDOW = 10  # the start phase stops when the last this many epochs' losses vary by less than the threshold


@dataclass(frozen=True)
class ALASettings:
    """The weights' learning rate, how much local data learns them, and the start phase's stopping rule."""

    eta: float
    batch_size: int
    threshold: float
    max_start_epochs: int


def top_names(model: nn.Module, layers: int) -> list[str]:
    """The parameters ALA weighs element-wise: the last `layers` parameter tensors (0: all of them); every lower
    parameter is taken from the global model whole."""
    names = [name for name, _ in model.named_parameters()]
    return names if layers <= 0 else names[-layers:]


def mix(local: torch.Tensor, received: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """theta + (Theta - theta) * W: element-wise, W = 1 takes the global model's value, W = 0 keeps the local one."""
    return local + (received - local) * weight


def adaptive_local_aggregation(
    model: nn.Module,
    local: Mapping[str, torch.Tensor],
    received: Mapping[str, torch.Tensor],
    weights: dict[str, torch.Tensor] | None,
    top: list[str],
    x: torch.Tensor,
    y: torch.Tensor,
    settings: ALASettings,
) -> tuple[dict[str, torch.Tensor], int]:
    """Set `model`'s parameters to the client's initialization for this round: lower parameters from `received`,
    the `top` ones mix(local, received, W), W learned on (x, y) in mini-batches by W <- clip(W - eta g * (Theta -
    theta), 0, 1), g the loss gradient at the mixed parameters. `weights` None is the start phase: W starts at 1 and
    learns for epochs until the last CONVERGED_WINDOW epoch losses have a standard deviation under the threshold
    (at most `max_start_epochs`); otherwise one epoch from the given W. Returns W and the epochs it took. The
    model's buffers (normalization statistics) are left as they were."""
    named = dict(model.named_parameters())
    start_phase = weights is None
    if weights is None:
        weights = {name: torch.ones_like(local[name]) for name in top}
    else:
        weights = dict(weights)
    saved = {name: p.requires_grad for name, p in named.items()}
    with torch.no_grad():
        for name, param in named.items():
            param.copy_(mix(local[name], received[name], weights[name]) if name in top else received[name])
            param.requires_grad_(name in top)
    epochs, losses = 0, []
    limit = settings.max_start_epochs if start_phase else 1
    # the forward passes run as in training (batch statistics, as the authors' copy of the local model does); the
    # statistics they would move are put back
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.train()
    while epochs < limit and len(y) > 0:
        loss = torch.zeros(())
        for start in range(0, len(y), settings.batch_size):
            batch = slice(start, start + settings.batch_size)
            loss = F.cross_entropy(model(x[batch]), y[batch])
            grads = torch.autograd.grad(loss, [named[name] for name in top])
            with torch.no_grad():
                for name, grad in zip(top, grads):
                    delta = received[name] - local[name]
                    weights[name] = torch.clamp(weights[name] - settings.eta * grad * delta, 0.0, 1.0)
                    named[name].copy_(mix(local[name], received[name], weights[name]))
        epochs += 1
        losses.append(float(loss.detach()))
        if len(losses) > CONVERGED_WINDOW and float(np.std(losses[-CONVERGED_WINDOW:])) < settings.threshold:
            break
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
    for name, param in named.items():
        param.requires_grad_(saved[name])
    return weights, epochs
