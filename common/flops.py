"""Training FLOPs from torch.utils.flop_counter on one batch, scaled per layer by its mask density."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode


def layer_flops(
    model: nn.Module,
    input_shape: tuple[int, ...],
    num_classes: int,
    batch_size: int = 8,
    trainable: set[str] | None = None,
) -> tuple[float, dict[str, float]]:
    """Forward + backward FLOPs of one batch in all and per module (torch's FLOP counter on the dense model).

    trainable: parameter names that get gradients (None: all); autograd skips the backward work of the rest
    (FedRep's head epochs cost a forward pass and the head's backward).
    """
    model = model.to("cpu")
    x = torch.zeros(batch_size, *input_shape)
    y = torch.zeros(batch_size, dtype=torch.long) % num_classes
    named = dict(model.named_parameters())
    saved = {name: p.requires_grad for name, p in named.items()}
    for name, p in named.items():
        p.requires_grad_(trainable is None or name in trainable)
    try:
        with FlopCounterMode(display=False) as counter:
            loss = F.cross_entropy(model(x), y)
            if loss.requires_grad:
                loss.backward()
    finally:
        for name, p in named.items():
            p.requires_grad_(saved[name])
    model.zero_grad(set_to_none=True)
    per_module = {key: float(sum(ops.values())) for key, ops in counter.get_flop_counts().items()}
    return float(counter.get_total_flops()), per_module


def scaled_per_sample(
    model_name: str, counted: tuple[float, dict[str, float]], densities: Mapping[str, float] | None, batch_size: int = 8
) -> float:
    """One sample's FLOPs from a batch's counts (layer_flops of a model of class `model_name`): a layer whose weight
    has density d counts d of its FLOPs."""
    total, per_module = counted
    for name, density in (densities or {}).items():
        total -= (1.0 - density) * per_module.get(f"{model_name}.{name.rsplit('.', 1)[0]}", 0.0)
    return total / batch_size


def flops_per_sample(
    model: nn.Module,
    input_shape: tuple[int, ...],
    num_classes: int,
    densities: Mapping[str, float] | None = None,
    batch_size: int = 8,
    trainable: set[str] | None = None,
) -> float:
    """Forward + backward FLOPs of one training sample; a layer whose weight has density d counts d of its FLOPs.

    densities: parameter name (e.g. 'body.3.weight') -> fraction of its weights that are active.
    trainable: parameter names that get gradients (None: all).
    """
    counted = layer_flops(model, input_shape, num_classes, batch_size, trainable)
    return scaled_per_sample(type(model).__name__, counted, densities, batch_size)


def training_flops(per_sample: float, num_samples: int, epochs: int) -> float:
    """FLOPs of `epochs` passes over `num_samples` samples."""
    return per_sample * num_samples * epochs
