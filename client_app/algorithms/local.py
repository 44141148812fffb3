"""Local training client: a personal model that never leaves the device."""

from __future__ import annotations

from flwr.app import RecordDict

from common.learning.models import SplitModel, get_arrays

from .base import ClientAlgorithm

PERSONAL = "personal"


class LocalClient(ClientAlgorithm):
    """Trains its own model from the common initialization; only metrics are sent."""

    def personal_model(self) -> SplitModel:
        """The stored personal model, or the common initialization on first use."""
        return self.stored_model(PERSONAL)

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Train the personal model and keep it."""
        model = self.personal_model()
        before = self.snapshot(model)
        stats = self.train_locally(model, server_round)
        self.env.state.save_arrays(PERSONAL, get_arrays(model))
        return self.train_reply(stats, None, stages={"L1": before, "L2": model})

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """Evaluate the personal model."""
        return self.eval_reply(self.evaluate_model(self.personal_model()))
