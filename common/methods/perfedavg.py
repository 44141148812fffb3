"""Per-FedAvg's meta step as a batch loss of the training loop (Fallah, Mokhtari, Ozdaglar, "Personalized Federated
Learning with Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020, Algorithm 1)."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from common.learning.train import BatchLoss


def batches_per_step(variant: str) -> int:
    """Mini-batches one meta step reads: D and D' (first-order), and D'' for the Hessian term (Hessian-free)."""
    return 3 if variant == "hf" else 2


def meta_loss(alpha: float, variant: str) -> BatchLoss:
    """The loss whose gradient at w is Per-FedAvg's meta-gradient on a batch split into D, D' (and D''):
    fo: grad f(w - alpha grad f(w; D); D'); hf: that minus alpha H(w; D'') times it (Algorithm 1's two variants; the
    Hessian-vector product exact by double backward, where the paper approximates it by finite differences of
    gradients). Its value is f at the adapted weights on D'. A batch too small to split is a plain step on it."""
    parts = batches_per_step(variant)

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if len(y) < parts:
            return F.cross_entropy(model(x), y)
        xs, ys = torch.tensor_split(x, parts), torch.tensor_split(y, parts)
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())
        inner = F.cross_entropy(functional_call(model, {**params, **buffers}, (xs[0],)), ys[0])
        grads = torch.autograd.grad(inner, list(params.values()))
        adapted = {name: p - alpha * g.detach() for (name, p), g in zip(params.items(), grads)}
        outer = F.cross_entropy(functional_call(model, {**adapted, **buffers}, (xs[1],)), ys[1])
        if variant != "hf":
            return outer
        v = [u.detach() for u in torch.autograd.grad(outer, list(params.values()))]
        hessian_loss = F.cross_entropy(model(xs[2]), ys[2])
        g2 = torch.autograd.grad(hessian_loss, list(params.values()), create_graph=True)
        # gradient v (from p . v) minus alpha times d/dw (grad f(w; D'') . v) = H(w; D'') v; the value reported is
        # f at the adapted weights
        surrogate = torch.stack(
            [(p * u).sum() - alpha * (g * u).sum() for p, g, u in zip(params.values(), g2, v)]
        ).sum()
        return outer.detach() + surrogate - surrogate.detach()

    return loss
