"""GPFL's modules and loss as plain torch (Zhang et al., "GPFL: Simultaneously Learning Global and Personalized
Feature Information for Personalized Federated Learning", ICCV 2023; details from the authors' code, TsingZ0/GPFL):
the global category embedding (GCE), the conditional valve (CoV) and the global and personalized conditional
inputs."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from common.learning.models import ModelLayout, SplitModel
from common.learning.train import BatchLoss
from common.seeding import derive_seed


class GlobalCategoryEmbedding(nn.Module):
    """One embedding per class; its loss is the cross-entropy of the cosine similarities between the features and
    the embeddings."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(classes, features)

    def loss(self, features: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy over cos(features, e_c)."""
        return F.cross_entropy(F.linear(F.normalize(features), F.normalize(self.embedding.weight)), y)


class ConditionalValve(nn.Module):
    """relu(x (gamma(c) + 1) + beta(c)): features scaled and shifted by two small networks of a conditional input c."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.gamma = nn.Sequential(nn.Linear(features, features), nn.ReLU(), nn.LayerNorm([features]))
        self.beta = nn.Sequential(nn.Linear(features, features), nn.ReLU(), nn.LayerNorm([features]))

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """The valve applied to a batch of features."""
        return F.relu(x * (self.gamma(context) + 1.0) + self.beta(context))


class GPFLModules(nn.Module):
    """GPFL's modules beside the model; their entries are named 'gce.*' and 'cov.*'."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.gce = GlobalCategoryEmbedding(features, classes)
        self.cov = ConditionalValve(features)


def added_modules(features: int, classes: int, seed: int) -> GPFLModules:
    """GPFL's modules at a seeded initialization (the same on the server and every client)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPFLModules(features, classes)


def added_layout_of(layout: ModelLayout, seed: int) -> ModelLayout:
    """The model's layout with GPFL's modules (seeded from the run's seed) after its own entries: what the server
    holds; ValueError for a model whose head is not one linear layer."""
    features, classes = layout.linear_head()
    return layout.extended(added_modules(features, classes, derive_seed(seed, "gpfl-modules")))


def conditional_inputs(embeddings: torch.Tensor, class_share: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The global conditional input (the embeddings' mean) and the personalized one (their mean weighted by the
    client's share of training samples per class)."""
    return embeddings.mean(dim=0), (embeddings * class_share[:, None]).sum(dim=0)


class GPFLModel(nn.Module):
    """The model with GPFL's modules; its logits are the personalized path's, head(CoV(body(x), personalized
    input)). `condition` fixes the message's conditional inputs from the embeddings as they are then."""

    def __init__(self, model: SplitModel, added: GPFLModules) -> None:
        super().__init__()
        self.body: nn.Module = model.body
        self.head: nn.Module = model.head
        self.gce: GlobalCategoryEmbedding = added.gce
        self.cov: ConditionalValve = added.cov
        features = self.gce.embedding.weight.shape[1]
        self.global_input = self.personal_input = torch.zeros(features)
        self.received_embeddings = self.gce.embedding.weight.detach().clone()

    def condition(self, class_share: torch.Tensor) -> GPFLModel:
        """Take the current (received) embeddings as the fixed targets and conditional inputs of this message."""
        with torch.no_grad():
            self.received_embeddings = self.gce.embedding.weight.detach().clone()
            self.global_input, self.personal_input = conditional_inputs(self.received_embeddings, class_share)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The personalized logits."""
        return self.head(self.cov(self.body(x), self.personal_input))


def gpfl_loss(lam: float, mu: float) -> BatchLoss:
    """A mini-batch's loss on a GPFLModel: cross-entropy of the personalized path, the GCE's loss on the global
    path's features, `lam` times the L2 norm of (global-path features - the received embeddings of the labels) over
    the batch, and (mu/2) times the squared norm of the GCE's and CoV's parameters (the authors' weight decay mu on
    those two alone)."""

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not isinstance(model, GPFLModel):
            raise TypeError(f"GPFL's loss trains a GPFLModel, got {type(model).__name__}")
        features = model.body(x)
        personal = model.head(model.cov(features, model.personal_input))
        generic = model.cov(features, model.global_input)
        total = F.cross_entropy(personal, y) + model.gce.loss(generic, y)
        total = total + lam * torch.norm(generic - model.received_embeddings[y], 2)
        if mu > 0:
            decay = torch.stack([(p**2).sum() for p in [*model.gce.parameters(), *model.cov.parameters()]]).sum()
            total = total + 0.5 * mu * decay
        return total

    return loss


def class_share(y: torch.Tensor, classes: int) -> torch.Tensor:
    """Each class's share of the training samples."""
    counts = torch.bincount(y.long(), minlength=classes).float()
    return counts / counts.sum().clamp(min=1.0)


def added_flops_per_sample(features: int, classes: int, batch_size: int) -> float:
    """Training FLOPs per sample of GPFL's additions (forward and backward, 3 units each as the model's count): the
    cosine logits against every embedding, the valve on both paths, and the valve's two networks on the two
    conditional inputs once per mini-batch (shared by its samples)."""
    cosine = 2 * features * classes
    valve = 2 * 3 * features  # scale, shift, relu on each path
    networks = 2 * 2 * 2 * features * features / max(batch_size, 1)
    return float(3 * (cosine + valve + networks))
