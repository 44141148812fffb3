"""FLIU's evaluation stages (FLIU [arXiv:2510.24503] Sec. III): G, L1, L2 with Acc(L), Acc(G), Acc and rho_eps.

"L1+" and "L2+" are L1 and L2 under DM-PFL+'s adaptive inference (the personal model of the stage and G).


Paper: Hussaini, Theiss, Stein, "Local Performance vs. Out-of-Distribution Generalization: An Empirical Analysis of
Personalized Federated Learning in Heterogeneous Data Environments", arXiv:2510.24503."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from common.learning.evaluate import predict_logits
from common.methods.aggregate import mean_std

STAGES = ("G", "L1", "L2", "L1+", "L2+")
SCOPES = ("local", "global")  # Acc(L): own test split; Acc(G): the pooled test set of all clients


def stage_key(stage: str, scope: str) -> str:
    """Metric name of a stage accuracy, e.g. 'stage-L1-acc-local'."""
    return f"stage-{stage}-acc-{scope}"


STAGE_KEYS = tuple(stage_key(stage, scope) for stage in STAGES for scope in SCOPES)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device | str = "cpu") -> float:
    """Plain accuracy of `model` on (x, y); NaN on an empty set."""
    if len(y) == 0:
        return float("nan")
    return float((predict_logits(model, x, device=device).argmax(1) == y).float().mean())


def stage_metrics(
    models: Mapping[str, nn.Module | None],
    own: tuple[torch.Tensor, torch.Tensor],
    pooled: tuple[torch.Tensor, torch.Tensor],
    device: torch.device | str = "cpu",
) -> dict[str, float]:
    """Acc(L) and Acc(G) of each stage's model (stages whose model is None are skipped)."""
    out: dict[str, float] = {}
    done: dict[int, tuple[float, float]] = {}  # one evaluation per model object (FedAvg's G and L1 are one)
    for stage, model in models.items():
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        if model is None:
            continue
        if id(model) not in done:
            done[id(model)] = (accuracy(model, *own, device=device), accuracy(model, *pooled, device=device))
        out[stage_key(stage, "local")], out[stage_key(stage, "global")] = done[id(model)]
    return out


def summarize_stages(rows: Sequence[Mapping[str, float]], eps: Sequence[float]) -> dict[str, dict]:
    """Per stage: mean/std of Acc(L), Acc(G) and Acc = Acc(L) + Acc(G) over clients, and rho_eps = #{Acc(L) > eps}."""
    out: dict[str, dict] = {}
    for stage in STAGES:
        lk, gk = stage_key(stage, "local"), stage_key(stage, "global")
        have = [row for row in rows if lk in row and gk in row]
        if not have:
            continue
        local = [row[lk] for row in have]
        glob = [row[gk] for row in have]
        out[stage] = {
            "clients": len(have),
            "acc_local": mean_std(local),
            "acc_global": mean_std(glob),
            "acc": mean_std([a + b for a, b in zip(local, glob)]),
            "rho": {f"{e:g}": sum(1 for a in local if a > e) for e in eps},
        }
    return out
