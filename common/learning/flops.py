"""Training FLOPs from torch.utils.flop_counter: each conv/linear layer's forward, input-gradient and weight-gradient
FLOPs counted on the dense model, then a pass as executed under masks and frozen parameters."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

log = logging.getLogger(__name__)
UNATTRIBUTED = "(outside weighted modules)"


@dataclass(frozen=True)
class LayerFlops:
    """One call of a weighted module in a training step of a batch, by torch's FLOP counter on the dense model."""

    weight: str  # the module's weight parameter, e.g. 'body.3.weight'
    forward: float
    input_grad: float  # the gradient of the module's input (computed only when `upstream` holds a trained parameter)
    weight_grad: float  # the gradient of `weight` (computed only when `weight` is trained)
    upstream: frozenset[str]  # the parameters the module's input depends on


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


def layer_parts(
    model: nn.Module, input_shape: tuple[int, ...], num_classes: int, batch_size: int = 8
) -> tuple[LayerFlops, ...]:
    """Each weighted module's forward, input-gradient and weight-gradient FLOPs of one batch, in call order.

    Each part is counted by torch's counter on the module alone, with its input as the model's forward gives it.
    Where the parts of a step with every parameter trained do not add up to the counter's count of that step on the
    whole model (FLOPs outside weighted modules, or a torch release that counts a pass differently), the difference
    is one more part, `UNATTRIBUTED`, counted whole under any mask, and a warning says so: a FLOPs figure must never
    fail a client's training."""
    model = model.to("cpu")
    names = {id(p): name for name, p in model.named_parameters()}
    calls: list[tuple[str, nn.Module, torch.Tensor, frozenset[str]]] = []

    def record(prefix: str, module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        calls.append((prefix, module, args[0].detach(), _upstream(args[0], names)))

    weighted = [
        (prefix, module)
        for prefix, module in model.named_modules()
        if isinstance(getattr(module, "weight", None), nn.Parameter) and not any(True for _ in module.children())
    ]
    handles = [
        module.register_forward_pre_hook(lambda m, args, prefix=prefix: record(prefix, m, args))
        for prefix, module in weighted
    ]
    saved = {name: p.requires_grad for name, p in model.named_parameters()}
    try:
        for p in model.parameters():
            p.requires_grad_(True)
        model(torch.zeros(batch_size, *input_shape))
    finally:
        for handle in handles:
            handle.remove()
        for name, p in model.named_parameters():
            p.requires_grad_(saved[name])
    parts = []
    for prefix, module, x, upstream in calls:
        forward, input_grad = _module_pass(module, x, input_grad=True)
        _, weight_grad = _module_pass(module, x, input_grad=False)
        if forward or input_grad or weight_grad:
            parts.append(LayerFlops(f"{prefix}.weight", forward, input_grad, weight_grad, upstream))
    model.zero_grad(set_to_none=True)
    counted, _ = layer_flops(model, input_shape, num_classes, batch_size)
    missing = counted - sum(sum(_executed(part, None)) for part in parts)
    if missing:
        log.warning(
            "%s: torch %s counts %.0f FLOPs a batch of %d outside the per-layer parts (%.2f%% of %.0f); they are "
            "counted whole under any mask",
            type(model).__name__,
            torch.__version__,
            missing,
            batch_size,
            100 * missing / counted if counted else 0.0,
            counted,
        )
        parts.append(LayerFlops(UNATTRIBUTED, missing, 0.0, 0.0, frozenset()))
    return tuple(parts)


def _module_pass(module: nn.Module, x: torch.Tensor, input_grad: bool) -> tuple[float, float]:
    """(forward, backward) FLOPs of `module` alone on `x`: the backward computes the input's gradient
    (`input_grad`) or the weight's, never both."""
    params = dict(module.named_parameters(recurse=False))
    saved = {name: p.requires_grad for name, p in params.items()}
    for name, p in params.items():
        p.requires_grad_(not input_grad and name == "weight")
    try:
        x = x.detach().requires_grad_(input_grad)
        with FlopCounterMode(display=False) as forward:
            out = module(x)
        with FlopCounterMode(display=False) as backward:
            out.backward(torch.ones_like(out))
    finally:
        for name, p in params.items():
            p.requires_grad_(saved[name])
    return float(forward.get_total_flops()), float(backward.get_total_flops())


def _upstream(x: torch.Tensor, names: Mapping[int, str]) -> frozenset[str]:
    """The named parameters whose gradients flow through `x` (its autograd graph's leaves)."""
    found: set[str] = set()
    seen: set[int] = set()
    stack = [x.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        variable = getattr(node, "variable", None)
        if variable is not None and id(variable) in names:
            found.add(names[id(variable)])
        stack.extend(child for child, _ in node.next_functions)
    return frozenset(found)


def _executed(part: LayerFlops, trainable: set[str] | None) -> tuple[float, float]:
    """(forward + input gradient, weight gradient) FLOPs autograd runs for a part when only `trainable` (None: all
    parameters) get gradients."""
    needs_input = bool(part.upstream) if trainable is None else not part.upstream.isdisjoint(trainable)
    needs_weight = trainable is None or part.weight in trainable
    return part.forward + (part.input_grad if needs_input else 0.0), part.weight_grad if needs_weight else 0.0


def executed_per_sample(
    parts: Sequence[LayerFlops],
    active: Mapping[str, float] | None = None,
    updated: Mapping[str, float] | None = None,
    trainable: set[str] | None = None,
    dense_grad: bool = False,
    batch_size: int = 8,
) -> float:
    """One sample's training FLOPs of a masked pass as executed, from a batch's `parts` (layer_parts).

    active: weight name -> fraction of the layer's weights non-zero in the forward (its mask); scales the layer's
    forward and input gradient. updated: weight name -> fraction whose gradient is applied (None: `active`); scales
    the weight gradient, unless `dense_grad` counts it whole (the full gradient that prune-and-regrow by |grad| needs
    and dense-tensor code computes). Layers absent from both, and biases, count whole. trainable: parameter names
    that get gradients (None: all): a layer's input gradient runs only when its input depends on one of them, its
    weight gradient only when its weight is one.
    """
    executed = [_executed(part, trainable) for part in parts]
    total = sum(flops + grad for flops, grad in executed)
    active = dict(active or {})
    updated = active if updated is None else dict(updated)
    for name in [*active, *(n for n in updated if n not in active)]:
        share, kept = active.get(name, 1.0), 1.0 if dense_grad else updated.get(name, 1.0)
        for part, (flops, grad) in zip(parts, executed):
            if part.weight == name:
                # the dense count less the masked-off share: the second term is 0 where all active weights update
                total -= (1.0 - share) * (flops + grad) + (share - kept) * grad
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
    parts = layer_parts(model, input_shape, num_classes, batch_size)
    return executed_per_sample(parts, densities, trainable=trainable, batch_size=batch_size)


def training_flops(per_sample: float, num_samples: int, epochs: int) -> float:
    """FLOPs of `epochs` passes over `num_samples` samples."""
    return per_sample * num_samples * epochs
