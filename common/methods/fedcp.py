"""FedCP's conditional policy network, model and loss as plain torch (Zhang et al., "FedCP: Separating Feature
Information for Personalized Federated Learning via Conditional Policy", KDD 2023; details from the authors' code,
TsingZ0/FedCP, the same in PFLlib): a policy splits each sample's features into a global part, fed to the global
head, and a personalized part, fed to the client's own head; a maximum mean discrepancy keeps the features near the
received feature extractor's."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from common.learning.models import ModelLayout, SplitModel
from common.learning.train import BatchLoss
from common.seeding import derive_seed

MMD_BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)  # the authors' RBF kernel bandwidths


def gumbel_softmax(logits: torch.Tensor, tau: float, generator: torch.Generator, dim: int) -> torch.Tensor:
    """softmax((logits + g) / tau) with g standard Gumbel noise drawn from `generator` (torch's soft Gumbel-softmax,
    seeded: F.gumbel_softmax draws from the global generator)."""
    gumbels = -torch.empty(logits.shape).exponential_(generator=generator).log().to(logits.device, logits.dtype)
    return F.softmax((logits + gumbels) / tau, dim=dim)


class ConditionalSelection(nn.Module):
    """The conditional policy network: relu(LayerNorm(Linear(F, 2F))) read as two logits per feature, softened by
    Gumbel noise into the personalized and the global share of that feature (they sum to 1)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(features, 2 * features), nn.LayerNorm([2 * features]), nn.ReLU())

    def forward(self, x: torch.Tensor, tau: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(personalized share, global share) of each feature of each sample."""
        shares = gumbel_softmax(self.fc(x).view(x.shape[0], 2, -1), tau, generator, dim=1)
        return shares[:, 0, :], shares[:, 1, :]


class FedCPModules(nn.Module):
    """FedCP's module beside the model; its entries are named 'cs.*'."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.cs = ConditionalSelection(features)


def added_modules(features: int, seed: int) -> FedCPModules:
    """FedCP's policy network at a seeded initialization (the same on the server and every client)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return FedCPModules(features)


def added_layout_of(layout: ModelLayout, seed: int) -> ModelLayout:
    """The model's layout with the policy network (seeded from the run's seed) after its own entries: what the server
    holds (its 'head.*' is the global head); ValueError for a model whose head is not one linear layer."""
    features, _ = layout.linear_head()
    return layout.extended(added_modules(features, derive_seed(seed, "fedcp-modules")))


def mmd_rbf(x: torch.Tensor, y: torch.Tensor, bandwidths: tuple[float, ...] = MMD_BANDWIDTHS) -> torch.Tensor:
    """The authors' empirical maximum mean discrepancy of two equal-sized batches: the mean over pairs of
    k(x_i, x_j) + k(y_i, y_j) - 2 k(x_i, y_j), k(a, b) = sum_a exp(-||a - b||^2 / (2 a)) over the bandwidths."""
    xx, yy, xy = x @ x.T, y @ y.T, x @ y.T
    rx, ry = xx.diag().unsqueeze(0), yy.diag().unsqueeze(0)
    dxx, dyy, dxy = rx.T + rx - 2.0 * xx, ry.T + ry - 2.0 * yy, rx.T + ry - 2.0 * xy
    total = torch.zeros_like(xx)
    for a in bandwidths:
        total = total + torch.exp(-0.5 * dxx / a) + torch.exp(-0.5 * dyy / a) - 2.0 * torch.exp(-0.5 * dxy / a)
    return total.mean()


class FedCPModel(nn.Module):
    """The model as FedCP trains it: `body` (trains, travels), `head` (the received global head: frozen, travels as
    the upload's mix), `cs` (the policy: trains, travels), `personal` (this client's head: trains, kept) and
    `received_body` (a frozen copy of the received feature extractor, the MMD's reference). Logits:
    personal(f * s_p) + head(f * s_g), f = body(x), (s_p, s_g) = cs(f * context / ||context||), the context being
    the column sums of the personal head's weight as the message began."""

    SPLITS_FEATURES = False

    def __init__(self, model: SplitModel, added: FedCPModules, tau: float, noise: torch.Generator) -> None:
        super().__init__()
        self.body: nn.Module = model.body
        self.head: nn.Module = copy.deepcopy(model.head)
        self.cs: ConditionalSelection = added.cs
        self.personal: nn.Module = model.head
        self.received_body: nn.Module = copy.deepcopy(model.body)
        self.tau = tau
        self.noise = noise  # the Gumbel noise of this message (seeded)
        self.context = torch.zeros(1)

    def frozen(self) -> set[str]:
        """Names of the parameters that never train: the global head and the received feature extractor."""
        return {name for name, _ in self.named_parameters() if name.startswith(("head.", "received_body."))}

    def set_context(self) -> FedCPModel:
        """Fix this message's context from the personal head as it is now."""
        with torch.no_grad():
            weight = self.personal.get_parameter("weight")
            self.context = F.normalize(weight.detach().sum(dim=0, keepdim=True), p=2, dim=1)
        return self

    def split(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The personalized and the global part of a batch of features."""
        personal, shared = self.cs(features * self.context.to(features.device), self.tau, self.noise)
        return features * personal, features * shared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The combined logits."""
        personal, shared = self.split(self.body(x))
        return self.personal(personal) + self.head(shared)


def fedcp_loss(lam: float) -> BatchLoss:
    """A mini-batch's loss on a FedCPModel: the cross-entropy of the combined logits plus `lam` times the MMD between
    the trained feature extractor's features and the received one's."""

    def loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not isinstance(model, FedCPModel):
            raise TypeError(f"FedCP's loss trains a FedCPModel, got {type(model).__name__}")
        features = model.body(x)
        personal, shared = model.split(features)
        total = F.cross_entropy(model.personal(personal) + model.head(shared), y)
        if lam > 0:
            with torch.no_grad():
                reference = model.received_body(x)
            total = total + lam * mmd_rbf(features, reference)
        return total

    return loss


def upload_head(personal: torch.Tensor, received: torch.Tensor) -> torch.Tensor:
    """The global head a client uploads: the mean of its personal head and the received global head."""
    return 0.5 * personal + 0.5 * received


def added_flops_per_sample(features: int, classes: int, mmd: bool, batch_size: int) -> float:
    """Training FLOPs per sample of FedCP's additions (forward 1 unit, backward 2, as the model's count): the policy
    network (forward and backward), the second head (forward, input gradient), the gating; the MMD's kernel
    matrices over a mini-batch (three F-dimensional inner products per pair, the batch's pairs per sample). The
    received extractor's forward pass is counted by the caller (the model's own forward FLOPs)."""
    policy = 3 * (2 * features * 2 * features + 3 * 2 * features)  # linear, norm and relu of 2F outputs
    second_head = 2 * (2 * features * classes)
    gating = 3 * 2 * 2 * features
    kernel = 3 * 3 * 2 * features * max(batch_size, 1) if mmd else 0
    return float(policy + second_head + gating + kernel)
