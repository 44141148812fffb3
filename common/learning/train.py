"""The one local training loop, with hooks for update masks, proximal terms, extra losses and gradients."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from common import profiling
from common.methods.masked_ops import TensorRestore


@dataclass(frozen=True)
class TrainSettings:
    """Optimizer and schedule of one local training call."""

    epochs: int
    batch_size: int
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    steps_per_batch: int = 1  # optimizer steps on each mini-batch (pFedMe's K inner steps)


@dataclass
class LossContext:
    """What an extra loss term may look at: the model, the batch, features and logits."""

    model: nn.Module
    x: torch.Tensor
    y: torch.Tensor
    features: torch.Tensor
    logits: torch.Tensor


ExtraLoss = Callable[[LossContext], torch.Tensor]
# a method's own loss of a mini-batch in place of cross-entropy plus extra terms (e.g. Per-FedAvg's meta step)
BatchLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class TrainStats:
    """Outcome of one local training call."""

    num_samples: int
    steps: int
    mean_loss: float
    epoch_losses: list[float] = field(default_factory=list)


def make_optimizer(params: Iterable[nn.Parameter], settings: TrainSettings) -> torch.optim.Optimizer:
    """SGD (with momentum and weight decay) or Adam, from the settings."""
    params = list(params)
    if settings.optimizer == "adam":
        return torch.optim.Adam(params, lr=settings.lr, weight_decay=settings.weight_decay)
    return torch.optim.SGD(params, lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay)


def proximal_loss(reference: Mapping[str, torch.Tensor], mu: float) -> ExtraLoss:
    """(mu / 2) * sum ||w - w_ref||^2 over the named parameters; its gradient is mu * (w - w_ref).

    The reference is detached once here; the live parameters carry the gradient (a term built from
    detached live weights would silently contribute nothing).
    """
    ref = {name: tensor.detach().clone() for name, tensor in reference.items()}

    def term(ctx: LossContext) -> torch.Tensor:
        total = torch.zeros((), device=ctx.logits.device)
        for name, param in ctx.model.named_parameters():
            if name in ref:
                total = total + (param - ref[name].to(param.device)).pow(2).sum()
        return 0.5 * mu * total

    return term


@dataclass(frozen=True)
class ProximalStep:
    """A pull toward `reference` solved in closed form after every optimizer step (a proximal-gradient step).

    After the loss step w~ = step(w), w = argmin_v ||v - w~||^2 / (2 lr) + (mu / 2) ||v - ref||^2
    = (w~ + lr mu ref) / (1 + lr mu): the minimizer of the same objective as the gradient term (mu/2)||w - ref||^2,
    but a contraction toward ref for every lr * mu, where the gradient form diverges once lr * mu > 2.
    lr is the optimizer's (for Adam too, where it is the step-size scale).
    """

    reference: Mapping[str, torch.Tensor]
    mu: float

    @classmethod
    def toward(cls, model: nn.Module, mu: float) -> ProximalStep:
        """A pull toward a detached copy of `model`'s current parameters."""
        return cls({name: p.detach().clone() for name, p in model.named_parameters()}, mu)

    def apply(self, named: Mapping[str, nn.Parameter], lr: float) -> None:
        """Move each referenced parameter to (w + lr mu ref) / (1 + lr mu), in place."""
        if self.mu <= 0.0:
            return
        share = lr * self.mu / (1.0 + lr * self.mu)
        with torch.no_grad():
            for name, ref in self.reference.items():
                param = named.get(name)
                if param is not None and param.requires_grad:
                    param.add_(ref.to(param.device) - param, alpha=share)


def _forward(model: nn.Module, x: torch.Tensor, split: bool) -> tuple[torch.Tensor, torch.Tensor]:
    # a SplitModel's features are its body's output; any other module (a method's wrapper with a body and a head of
    # its own, e.g. GPFL's valve between them) is called whole
    if split:
        features = model.get_submodule("body")(x)
        return features, model.get_submodule("head")(features)
    logits = model(x)
    return logits, logits


@profiling.timed("train")
def train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    settings: TrainSettings,
    generator: torch.Generator,
    update_masks: Mapping[str, torch.Tensor] | None = None,
    extra_losses: Iterable[ExtraLoss] = (),
    trainable: set[str] | None = None,
    on_gradients: Callable[[nn.Module], None] | None = None,
    proximal: ProximalStep | None = None,
    batch_loss: BatchLoss | None = None,
    after_batch: Callable[[nn.Module], None] | None = None,
    device: torch.device | str = "cpu",
) -> TrainStats:
    """Train `model` in place on (x, y) for `settings.epochs` epochs of shuffled mini-batches.

    update_masks: parameter name -> bool tensor; positions where it is False never change (their
        gradient is zeroed and, since weight decay and momentum would still move them, their values are
        restored after every step).
    trainable: parameter names to update (None: all); the others are frozen and get no gradient.
    on_gradients: called after each backward pass, before masking (e.g. to collect dense gradients).
    proximal: a pull toward a reference applied in closed form after each step (stable for any coefficient).
    batch_loss: the loss of a mini-batch (model, x, y) in place of cross-entropy plus `extra_losses` (not both).
    after_batch: called after a mini-batch's `settings.steps_per_batch` steps (e.g. pFedMe's outer update).
    A mini-batch's loss in the statistics is that of its first step.
    """
    if batch_loss is not None and extra_losses:
        raise ValueError("batch_loss replaces the cross-entropy and its extra losses: give one or the other")
    split = getattr(type(model), "SPLITS_FEATURES", False)
    device = torch.device(device)
    model.to(device).train()
    extra_losses = list(extra_losses)
    named = dict(model.named_parameters())
    saved_requires_grad = {name: p.requires_grad for name, p in named.items()}
    if trainable is not None:
        for name, p in named.items():
            p.requires_grad_(name in trainable)
    params = [p for p in named.values() if p.requires_grad]
    masks = {name: m.to(device=device, dtype=torch.bool) for name, m in (update_masks or {}).items() if name in named}
    # the gradient is multiplied by the mask as a float (as by the bool mask, without a cast per step)
    gradient_masks = {name: m.to(named[name].dtype) for name, m in masks.items()}
    restores = {name: TensorRestore(m, named[name]) for name, m in masks.items()}
    n = len(y)
    stats = TrainStats(num_samples=n, steps=0, mean_loss=float("nan"))
    if n == 0 or settings.epochs == 0 or not params:
        _restore_requires_grad(named, saved_requires_grad)
        return stats
    optimizer = make_optimizer(params, settings)
    total_loss, total_seen = 0.0, 0
    for _ in range(settings.epochs):
        order = torch.randperm(n, generator=generator)
        epoch_loss, epoch_seen = 0.0, 0
        for start in range(0, n, settings.batch_size):
            batch = order[start : start + settings.batch_size]
            xb, yb = x[batch].to(device), y[batch].to(device)
            for inner in range(settings.steps_per_batch):
                optimizer.zero_grad(set_to_none=True)
                if batch_loss is not None:
                    loss = batch_loss(model, xb, yb)
                else:
                    features, logits = _forward(model, xb, split)
                    loss = F.cross_entropy(logits, yb)
                    if extra_losses:
                        ctx = LossContext(model, xb, yb, features, logits)
                        loss = loss + sum(term(ctx) for term in extra_losses)
                loss.backward()
                if on_gradients is not None:
                    on_gradients(model)
                for name, mask in gradient_masks.items():
                    grad = named[name].grad
                    if grad is not None:
                        grad.mul_(mask)
                optimizer.step()
                if proximal is not None:
                    proximal.apply(named, optimizer.param_groups[0]["lr"])
                if restores:
                    with torch.no_grad():
                        for name, restore in restores.items():
                            restore(named[name].detach())
                stats.steps += 1
                if inner == 0:
                    epoch_loss += float(loss.detach()) * len(batch)
            if after_batch is not None:
                after_batch(model)
            epoch_seen += len(batch)
        stats.epoch_losses.append(epoch_loss / epoch_seen)
        total_loss += epoch_loss
        total_seen += epoch_seen
    stats.mean_loss = total_loss / total_seen
    _restore_requires_grad(named, saved_requires_grad)
    return stats


def _restore_requires_grad(named: Mapping[str, nn.Parameter], saved: Mapping[str, bool]) -> None:
    for name, p in named.items():
        p.requires_grad_(saved[name])


class MeanGradient:
    """An `on_gradients` hook: mean gradient of the named parameters over the steps from `start_step` on.

    With start_step = (epochs - 1) * batches_per_epoch it averages over the last local epoch's batches.
    """

    def __init__(self, names: Iterable[str], start_step: int = 0) -> None:
        self.names = set(names)
        self.start_step = start_step
        self.step = 0
        self.count = 0
        self.sums: dict[str, torch.Tensor] = {}

    def __call__(self, model: nn.Module) -> None:
        """Accumulate this step's gradients (before any masking)."""
        if self.step >= self.start_step:
            for name, param in model.named_parameters():
                if name in self.names and param.grad is not None:
                    grad = param.grad.detach()
                    self.sums[name] = self.sums[name] + grad if name in self.sums else grad.clone()
            self.count += 1
        self.step += 1

    def mean(self) -> dict[str, torch.Tensor]:
        """Mean gradient per parameter (empty if no step was collected)."""
        return {name: total / max(self.count, 1) for name, total in self.sums.items()}
