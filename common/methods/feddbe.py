"""FedDBE's domain bias eliminator as plain torch: the personalized representation bias memory (a learned vector
added to the features) and the mean regularization toward the clients' global mean representation (Zhang et al.,
"Eliminating Domain Bias for Federated Learning in Representation Space", NeurIPS 2023; details from the authors'
code, TsingZ0/DBE)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from common.learning.models import SplitModel
from common.learning.train import BatchLoss


def feature_size(specs: Sequence[tuple[str, tuple[int, ...]]]) -> int:
    """The size of the feature extractor's output: the input size of the model's linear head ('head.weight')."""
    for name, shape in specs:
        if name == "head.weight" and len(shape) == 2:
            return int(shape[1])
    raise ValueError("FedDBE needs a model whose head is one linear layer ('head.weight')")


class DBEModel(nn.Module):
    """The shared model with the client's bias vector between its feature extractor and its head."""

    def __init__(self, shared: SplitModel, bias: torch.Tensor) -> None:
        super().__init__()
        self.shared = shared
        self.bias = nn.Parameter(bias.clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """head(body(x) + bias)."""
        return self.shared.head(self.shared.body(x) + self.bias)


class RunningMean:
    """The local training's running mean of the representations, m <- (1 - momentum) m + momentum mean(batch),
    from zero at the start of each local training; the current batch's term keeps its gradient, the past is fixed."""

    def __init__(self, size: int, momentum: float) -> None:
        self.momentum = momentum
        self.value = torch.zeros(size)

    def update(self, features: torch.Tensor) -> torch.Tensor:
        """The mean after this batch (with the batch's gradient); the stored value is detached."""
        current = (1.0 - self.momentum) * self.value.to(features) + self.momentum * features.mean(dim=0)
        self.value = current.detach()
        return current


def dbe_loss(running: RunningMean, global_mean: torch.Tensor | None, weight: float) -> BatchLoss:
    """A mini-batch's loss on a DBEModel: cross-entropy of head(body(x) + bias) plus `weight` times the mean of
    0.5 (running mean - global mean)^2 over the feature dimensions (mean regularization). Without a global mean
    (round 0, or no client answered it) plain cross-entropy of the shared model, the bias unused, as the authors'
    client before it has the mean."""

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not isinstance(model, DBEModel):
            raise TypeError(f"FedDBE's loss trains a DBEModel, got {type(model).__name__}")
        features = model.shared.body(x)
        mean = running.update(features)
        if global_mean is None:
            return F.cross_entropy(model.shared.head(features), y)
        regularizer = torch.mean(0.5 * (mean - global_mean.to(mean)) ** 2)
        return F.cross_entropy(model.shared.head(features + model.bias), y) + weight * regularizer

    return loss
