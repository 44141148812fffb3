"""Personal/shared model parts: which state-dict entries travel for split methods (LG-FedAvg, FedPer, FedRep,
FedBN), and APFL's mixture alpha * v + (1 - alpha) * w as a trainable module, alone or with the local model w (one
local step of APFL's Algorithm 1 per optimizer step)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from common.learning.train import LossContext

PARTS = ("all", "head", "body", "no-norm", "no-head")  # what an algorithm shares with the server
NORM_LAYERS = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
    nn.GroupNorm,
    nn.LayerNorm,
)


def norm_entries(model: nn.Module) -> list[str]:
    """State-dict names of the normalization layers' parameters and statistics (what FedBN keeps local)."""
    names: list[str] = []
    for prefix, module in model.named_modules():
        if isinstance(module, NORM_LAYERS):
            names.extend(f"{prefix}.{key}" for key in module.state_dict())
    return names


def shared_names(names: Sequence[str], part: str, norm: Iterable[str] = ()) -> list[str]:
    """The entries of `names` (state-dict order) that travel: all, the head, the body, all but norm layers, or all
    but the head (the body and any module an algorithm adds beside the model: GPFL's)."""
    if part == "all":
        return list(names)
    if part in ("head", "body"):
        return [n for n in names if n.startswith(f"{part}.")]
    if part == "no-head":
        return [n for n in names if not n.startswith("head.")]
    if part == "no-norm":
        local = set(norm)
        return [n for n in names if n not in local]
    raise ValueError(f"unknown shared part {part!r}; parts: {', '.join(PARTS)}")


def mixture_arrays(
    v: Sequence[np.ndarray], w: Sequence[np.ndarray], alpha: float, mixed: Sequence[bool]
) -> list[np.ndarray]:
    """APFL's personalized model alpha * v + (1 - alpha) * w on the parameters (`mixed`), v's own buffers elsewhere."""
    return [
        (alpha * a + (1.0 - alpha) * b).astype(np.float32) if m else np.asarray(a, np.float32)
        for a, b, m in zip(v, w, mixed)
    ]


class Mixture(nn.Module):
    """alpha * v + (1 - alpha) * w as one module: v's parameters and alpha train, w is fixed (APFL, Deng et al.
    2020). alpha is projected onto [0, 1] before each forward pass (so every step is a projected gradient step);
    `clamped_alpha` projects the last one."""

    def __init__(self, personal: nn.Module, shared: Mapping[str, torch.Tensor], alpha: float) -> None:
        super().__init__()
        self.personal = personal
        self.alpha = nn.Parameter(torch.tensor(float(alpha)))
        self._shared = {name: tensor.detach().clone() for name, tensor in shared.items()}

    def shared_values(self) -> Mapping[str, torch.Tensor]:
        """w's parameters by name, outside the graph (here the copy taken at construction)."""
        return self._shared

    def mixture_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the mixed model; gradients reach v and alpha, never w."""
        with torch.no_grad():
            self.alpha.clamp_(0.0, 1.0)
        a, shared = self.alpha, self.shared_values()
        params = {name: a * p + (1.0 - a) * shared[name].to(p.device) for name, p in self.personal.named_parameters()}
        return functional_call(self.personal, params, (x,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the mixed model."""
        return self.mixture_logits(x)

    def clamped_alpha(self) -> float:
        """alpha projected onto [0, 1]."""
        return float(self.alpha.detach().clamp(0.0, 1.0))


class InterleavedMixture(Mixture):
    """APFL's local model w, personal model v and alpha as one module, so that one optimizer step on
    CE(w(x)) + `mixture_loss` is one local step of APFL's Algorithm 1: w moves by its own gradient only, v and alpha
    by the gradient of alpha * v + (1 - alpha) * w, built from w's current values (detached).

    `forward` gives w's logits (the training loop's main loss); `mixture_loss` is the extra loss term."""

    def __init__(self, local: nn.Module, personal: nn.Module, alpha: float) -> None:
        super().__init__(personal, {}, alpha)
        self.local = local
        self._mixture_loss_sum = torch.zeros(())
        self._mixture_seen = 0

    def shared_values(self) -> Mapping[str, torch.Tensor]:
        """w's current parameters, detached: the mixture follows w step by step but sends it no gradient."""
        return {name: p.detach() for name, p in self.local.named_parameters()}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of w."""
        return self.local(x)

    def mixture_loss(self, ctx: LossContext) -> torch.Tensor:
        """Cross-entropy of the mixture on the batch (an `extra_losses` term of common.learning.train.train),
        recorded."""
        loss = F.cross_entropy(self.mixture_logits(ctx.x), ctx.y)
        self._mixture_loss_sum = self._mixture_loss_sum.to(loss.device) + loss.detach() * len(ctx.y)
        self._mixture_seen += len(ctx.y)
        return loss

    def mixture_mean_loss(self) -> float:
        """Mean mixture loss per sample over the steps so far (0 before any)."""
        return float(self._mixture_loss_sum) / self._mixture_seen if self._mixture_seen else 0.0
