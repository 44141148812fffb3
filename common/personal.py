"""Personal/shared model parts: which state-dict entries travel for split methods (LG-FedAvg, FedPer, FedRep,
FedBN), and APFL's mixture alpha * v + (1 - alpha) * w as a trainable module."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

PARTS = ("all", "head", "body", "no-norm")  # what an algorithm shares with the server
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
    """The entries of `names` (state-dict order) that travel: all, the head, the body, or all but norm layers."""
    if part == "all":
        return list(names)
    if part in ("head", "body"):
        return [n for n in names if n.startswith(f"{part}.")]
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
    2020). alpha is clamped to [0, 1] in the forward pass; `clamped_alpha` is the projection to keep."""

    def __init__(self, personal: nn.Module, shared: Mapping[str, torch.Tensor], alpha: float) -> None:
        super().__init__()
        self.personal = personal
        self.alpha = nn.Parameter(torch.tensor(float(alpha)))
        self._shared = {name: tensor.detach().clone() for name, tensor in shared.items()}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the mixed model."""
        a = self.alpha.clamp(0.0, 1.0)
        params = {
            name: a * p + (1.0 - a) * self._shared[name].to(p.device) for name, p in self.personal.named_parameters()
        }
        return functional_call(self.personal, params, (x,))

    def clamped_alpha(self) -> float:
        """alpha projected onto [0, 1]."""
        return float(self.alpha.detach().clamp(0.0, 1.0))
