"""FedAvg and FedProx clients: train the received global model and upload it."""

from __future__ import annotations

from flwr.app import RecordDict

from common.learning.models import SplitModel
from common.learning.train import ExtraLoss, proximal_loss

from .base import ClientAlgorithm


class FedAvgClient(ClientAlgorithm):
    """Local SGD on the received global model; uploads the full model."""

    def extra_losses(self, model: SplitModel, content: RecordDict) -> list[ExtraLoss]:
        """Additional loss terms (none for FedAvg)."""
        return []

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Train the global model for local-epochs and send it back (stages: G = L1 = the received model)."""
        model = self.received_model(content)
        received = self.snapshot(model)
        stats = self.train_locally(model, server_round, extra_losses=self.extra_losses(model, content))
        return self.train_reply(stats, model, stages={"G": received, "L1": received, "L2": model})


class FedProxClient(FedAvgClient):
    """FedAvg plus the proximal term (mu/2)||w - w_global||^2 toward the received model."""

    def extra_losses(self, model: SplitModel, content: RecordDict) -> list[ExtraLoss]:
        """The proximal term with the mu the server sent, anchored at the received global weights."""
        return [proximal_loss(dict(model.named_parameters()), self.proximal_mu(content))]


class FedAvgFTClient(FedAvgClient):
    """FedAvg+FT: trains like FedAvg; evaluates the global model after local-epochs of local fine-tuning.

    The fine-tuned copy is thrown away after evaluation (no extra communication, no state).
    """

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """Fine-tune the received global model on the local training data, then evaluate it."""
        model = self.received_model(content)
        self.train_locally(model, server_round, "finetune")
        return self.eval_reply(self.evaluate_model(model))
