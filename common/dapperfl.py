"""DapperFL's math (DapperFL [arXiv:2412.05823], Sec. 3; SPEC 3.4): the fusion factor schedule (Eq. 2),
fusion (Eq. 1), l1 channel selection, the domain adaptive regularizer (Eq. 3), and the server's recovery of
pruned uploads (Eq. 6) and their aggregation (Eq. 7).

Paper: Jia et al., "DapperFL: Domain Adaptive Federated Learning with Model Fusion Pruning for Edge Devices", NeurIPS
2024, arXiv:2412.05823."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .aggregate import weighted_average
from .channels import ChannelGroup, keep_count, recover
from .train import ExtraLoss, LossContext


def fusion_factor(server_round: int, alpha0: float, alpha_min: float, eps: float) -> float:
    """alpha_t = max((1 - eps)^(t - 1) * alpha_0, alpha_min) for round t >= 1 (Eq. 2)."""
    if server_round < 1:
        raise ValueError(f"rounds start at 1, got {server_round}")
    return max((1.0 - eps) ** (server_round - 1) * alpha0, alpha_min)


def fuse(
    global_state: Mapping[str, torch.Tensor], local_state: Mapping[str, torch.Tensor], alpha: float
) -> dict[str, torch.Tensor]:
    """w = alpha * W + (1 - alpha) * w_hat for every floating-point entry (Eq. 1), on the local model's device;
    counters stay the local ones."""
    return {
        name: (alpha * global_state[name].to(value.device) + (1.0 - alpha) * value)
        if value.is_floating_point()
        else value
        for name, value in local_state.items()
    }


def channel_scores(weight: np.ndarray) -> np.ndarray:
    """l1 norm of every output channel of a conv or linear weight (dim 0)."""
    return np.abs(np.asarray(weight, dtype=np.float64)).reshape(weight.shape[0], -1).sum(axis=1)


def keep_mask(scores: np.ndarray, ratio: float) -> np.ndarray:
    """Keep the keep_count(n, ratio) channels of largest l1 norm; among equal norms the lower index is kept."""
    n = len(scores)
    order = np.lexsort((-np.arange(n), scores))  # ascending norm; among ties the higher index first
    mask = np.ones(n, dtype=bool)
    mask[order[: n - keep_count(n, ratio)]] = False
    return mask


def select_channels(state: Mapping[str, np.ndarray], groups: Sequence[ChannelGroup], ratio: float) -> list[np.ndarray]:
    """The binary channel mask M of every group: the l1 selection on the producing layer's weights."""
    return [keep_mask(channel_scores(state[f"{g.scorer}.weight"]), ratio) for g in groups]


def dar_loss(gamma: float) -> ExtraLoss:
    """gamma * mean over the batch of ||z||_2^2, z the encoder output (Eq. 3 and 5)."""

    def term(ctx: LossContext) -> torch.Tensor:
        return gamma * ctx.features.flatten(1).pow(2).sum(dim=1).mean()

    return term


def aggregate(
    previous: Sequence[np.ndarray],
    names: Sequence[str],
    uploads: Sequence[Mapping[str, np.ndarray]],
    indices: Sequence[Mapping[str, Mapping[int, np.ndarray]]],
    weights: Sequence[float],
) -> list[np.ndarray]:
    """Recover every upload to full shape from the previous global model (Eq. 6), then their sample-weighted
    average (Eq. 7)."""
    recovered = [
        [recover(upload[name], ref, index.get(name, {})) for name, ref in zip(names, previous, strict=True)]
        for upload, index in zip(uploads, indices, strict=True)
    ]
    return weighted_average(recovered, weights)
