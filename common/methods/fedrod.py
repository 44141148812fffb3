"""FedRoD's two heads and their losses as plain torch (Chen, Chao, "On Bridging Generic and Personalized Federated
Learning for Image Classification", ICLR 2022: the linear personalized head; the balanced softmax of Ren et al.,
"Balanced Meta-Softmax for Long-Tailed Visual Recognition", NeurIPS 2020)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from common.learning.models import SplitModel
from common.learning.train import BatchLoss


def balanced_softmax_loss(logits: torch.Tensor, y: torch.Tensor, class_counts: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of logits + log(n_c), n_c the client's training samples of class c: the softmax the client's
    label skew implies, so that the logits themselves estimate class-balanced posteriors (a class the client has no
    sample of gets log 0 = -inf: no probability, no gradient)."""
    return F.cross_entropy(logits + class_counts.to(logits).log(), y)


class RoDModel(nn.Module):
    """The generic model (body and generic head: trained with the balanced softmax, shared) beside the client's
    personalized head; its logits are the generic head's plus the personalized head's on the same features."""

    def __init__(self, generic: SplitModel, personal_head: nn.Module) -> None:
        super().__init__()
        self.generic = generic
        self.personal_head = personal_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The personalized logits."""
        features = self.generic.body(x)
        return self.generic.head(features) + self.personal_head(features)


def rod_loss(class_counts: torch.Tensor) -> BatchLoss:
    """The loss of a mini-batch whose gradient trains both heads at once: the balanced softmax of the generic
    logits (body and generic head) plus the cross-entropy of generic logits (held fixed) + personalized logits on
    the features (held fixed), which reaches the personalized head only."""

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not isinstance(model, RoDModel):
            raise TypeError(f"FedRoD's loss trains a RoDModel, got {type(model).__name__}")
        features = model.generic.body(x)
        generic = model.generic.head(features)
        personal = generic.detach() + model.personal_head(features.detach())
        return balanced_softmax_loss(generic, y, class_counts) + F.cross_entropy(personal, y)

    return loss
