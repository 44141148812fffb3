"""MOON's model-contrastive loss (Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021, Eq. 3-4) as an
extra loss term of the training loop."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from common.learning.train import ExtraLoss, LossContext


def contrastive_loss(z: torch.Tensor, z_global: torch.Tensor, z_previous: torch.Tensor, tau: float) -> torch.Tensor:
    """Mean over the batch of -log(exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau))),
    sim the cosine similarity of flattened representations (Eq. 3)."""
    z, z_global, z_previous = z.flatten(1), z_global.flatten(1), z_previous.flatten(1)
    positive = F.cosine_similarity(z, z_global, dim=1) / tau
    negative = F.cosine_similarity(z, z_previous, dim=1) / tau
    # -log(e^p / (e^p + e^n)) = logsumexp(p, n) - p, without overflow for small tau
    return (torch.logsumexp(torch.stack([positive, negative]), dim=0) - positive).mean()


def model_contrastive(global_body: nn.Module, previous_body: nn.Module, mu: float, tau: float) -> ExtraLoss:
    """mu times the contrastive loss of the batch's representation against those of the global model's and the
    previous local model's feature extractors (fixed: no gradient reaches them)."""
    for body in (global_body, previous_body):
        body.requires_grad_(False)

    def term(ctx: LossContext) -> torch.Tensor:
        with torch.no_grad():
            z_global = global_body.to(ctx.x.device)(ctx.x)
            z_previous = previous_body.to(ctx.x.device)(ctx.x)
        return mu * contrastive_loss(ctx.features, z_global, z_previous, tau)

    return term
