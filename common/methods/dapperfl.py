"""DapperFL's math (DapperFL [arXiv:2412.05823], Sec. 3): the fusion factor schedule (Eq. 2),
fusion (Eq. 1), l1 channel selection, the domain adaptive regularizer (Eq. 3), and the server's recovery of
pruned uploads (Eq. 6) and their aggregation (Eq. 7).

Two variants (run-config `dapperfl-variant`): `paper` follows the paper's equations; `official` reproduces the
effective behaviour of the authors' public code (github.com/jyzgh/DapperFL, `models/dapperfl.py`): no fusion (its
Eq. 1 is guarded by `prune.is_pruned(...)`, never true at that point, so the fine-tuned model is pruned as it is),
the public code's layer-wise pruning (`_res_pruning`: every conv but the first, shortcut convs included, each batch
norm's scale but the first, every linear layer's input columns) applied as fixed zeros in the full-shape model (its
Eq. 6 recovery is written into `weight`, which `prune.remove` then overwrites with `weight_orig * mask`, so pruned
positions are uploaded and averaged as zeros), and a DAR term of ||z||, not ||z||^2.

Paper: Jia et al., "DapperFL: Domain Adaptive Federated Learning with Model Fusion Pruning for Edge Devices", NeurIPS
2024, arXiv:2412.05823."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn.utils import prune

from common.learning.train import ExtraLoss, LossContext
from common.methods.aggregate import weighted_average
from common.methods.channels import ChannelGroup, keep_count, recover

PAPER, OFFICIAL = "paper", "official"  # the values of run-config `dapperfl-variant`

# how the public code prunes a layer's `weight` (each by torch.nn.utils.prune, `amount` = the pruning ratio)
OUT = "out"  # output channels by l1 norm (ln_structured, n=1, dim=0)
IN_OUT = "in+out"  # input channels by l1 norm, then output channels by l1 norm (dim=1, then dim=0)
SCALE = "scale"  # a batch norm's scale, entry by entry by magnitude (l1_unstructured)
COLUMNS = "columns"  # a linear layer's input features by l2 norm (ln_structured, n=2, dim=1)


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


def dar_loss(gamma: float, variant: str = PAPER) -> ExtraLoss:
    """gamma * mean over the batch of ||z||_2^2, z the encoder output (Eq. 3 and 5); `official`: of ||z||_2 (the
    public code's `features.norm(dim=1).mean()`)."""
    if variant == OFFICIAL:

        def norm_term(ctx: LossContext) -> torch.Tensor:
            return gamma * ctx.features.flatten(1).norm(dim=1).mean()

        return norm_term

    def term(ctx: LossContext) -> torch.Tensor:
        return gamma * ctx.features.flatten(1).pow(2).sum(dim=1).mean()

    return term


def pruning_input(
    variant: str, global_state: Mapping[str, torch.Tensor], tuned_state: Mapping[str, torch.Tensor], alpha: float
) -> dict[str, torch.Tensor]:
    """The model MFP prunes after its fine-tuning epoch: the fusion with the global model (Eq. 1) in `paper`, the
    fine-tuned model itself in `official`."""
    if variant == OFFICIAL:
        return dict(tuned_state)
    return fuse(global_state, tuned_state, alpha)


def official_plan(model: nn.Module) -> list[tuple[str, str]]:
    """(module name, how) of every layer the public code's `_res_pruning` prunes, in module order: each conv but
    the first (the first block conv and the first shortcut conv by output channel only, the others by input and
    output channel), each 2-d batch norm but the one after the first conv, every linear layer's input columns."""
    plan: list[tuple[str, str]] = []
    convs = shortcuts = 0
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d):
            if convs > 0 and "shortcut" in name:
                plan.append((name, OUT if shortcuts == 0 else IN_OUT))
                shortcuts += 1
            elif convs > 0:
                plan.append((name, OUT if convs == 1 else IN_OUT))
            convs += 1
        elif isinstance(module, nn.BatchNorm2d) and convs != 1:
            plan.append((name, SCALE))
        elif isinstance(module, nn.Linear):
            plan.append((name, COLUMNS))
    return plan


def official_prune(model: nn.Module, ratio: float) -> dict[str, torch.Tensor]:
    """Prune `model` in place as the public code does (official_plan, torch.nn.utils.prune at `ratio`): the pruned
    entries of each weight become 0. Returns weight name -> bool mask (True: kept) to hold those zeros in training."""
    masks: dict[str, torch.Tensor] = {}
    for name, how in official_plan(model):
        module = model.get_submodule(name)
        order = list(module._parameters)
        if how == SCALE:
            prune.l1_unstructured(module, "weight", amount=ratio)
        elif how == COLUMNS:
            prune.ln_structured(module, "weight", amount=ratio, n=2, dim=1)
        else:
            if how == IN_OUT:
                prune.ln_structured(module, "weight", amount=ratio, n=1, dim=1)
            prune.ln_structured(module, "weight", amount=ratio, n=1, dim=0)
        masks[f"{name}.weight"] = module.get_buffer("weight_mask").detach().to(torch.bool).clone()
        prune.remove(module, "weight")  # weight = weight_orig * mask, a plain parameter again
        for key in order:  # remove() re-registers `weight` last: restore the state-dict order
            module._parameters[key] = module._parameters.pop(key)
    return masks


def aggregate(
    previous: Sequence[np.ndarray],
    names: Sequence[str],
    uploads: Sequence[Mapping[str, np.ndarray]],
    indices: Sequence[Mapping[str, Mapping[int, np.ndarray]]],
    weights: Sequence[float],
) -> list[np.ndarray]:
    """Recover every upload to full shape from the previous global model (Eq. 6), then their sample-weighted
    average (Eq. 7). A full-shape upload (no indices: the `official` variant's) is averaged as it is."""
    return weighted_average(recover_uploads(previous, names, uploads, indices), weights)


def recover_uploads(
    previous: Sequence[np.ndarray],
    names: Sequence[str],
    uploads: Sequence[Mapping[str, np.ndarray]],
    indices: Sequence[Mapping[str, Mapping[int, np.ndarray]]],
) -> list[list[np.ndarray]]:
    """Every upload at full shape, its pruned entries taken from the previous global model (Eq. 6)."""
    return [
        [recover(upload[name], ref, index.get(name, {})) for name, ref in zip(names, previous, strict=True)]
        for upload, index in zip(uploads, indices, strict=True)
    ]
