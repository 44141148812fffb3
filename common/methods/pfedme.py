"""pFedMe's local model and its Moreau-envelope regularizer as plain torch (Dinh, Tran, Nguyen, "Personalized
Federated Learning with Moreau Envelopes", NeurIPS 2020, Algorithm 1)."""

from __future__ import annotations

import torch
from torch import nn

from common.learning.train import LossContext


class MoreauEnvelope:
    """The client's local model w_i beside the personal model theta being trained: `term` is the inner problem's
    regularizer (lambda/2) ||theta - w_i||^2, `outer_step` the update w_i <- w_i - eta lambda (w_i - theta) after a
    mini-batch's K inner steps."""

    def __init__(self, model: nn.Module, lam: float, lr: float) -> None:
        self.lam = lam
        self.lr = lr
        self.local = {name: p.detach().clone() for name, p in model.named_parameters()}

    def term(self, ctx: LossContext) -> torch.Tensor:
        """(lambda/2) sum ||theta - w_i||^2 over the personal model's parameters (w_i held fixed)."""
        total = torch.zeros((), device=ctx.logits.device)
        for name, param in ctx.model.named_parameters():
            total = total + (param - self.local[name].to(param.device)).pow(2).sum()
        return 0.5 * self.lam * total

    def outer_step(self, model: nn.Module) -> None:
        """w_i <- w_i - eta lambda (w_i - theta), theta the personal model as the inner steps left it."""
        with torch.no_grad():
            for name, param in model.named_parameters():
                w = self.local[name]
                w.sub_(self.lr * self.lam * (w - param.detach().to(w.device)))

    def local_state(self) -> dict[str, torch.Tensor]:
        """w_i by parameter name."""
        return self.local
