"""A held-out client's half, whatever the algorithm: it never trains; it evaluates the model a new client receives,
as received and after a few epochs of local fine-tuning (the run's `unseen` row)."""

from __future__ import annotations

from dataclasses import replace

from flwr.app import RecordDict

from common.algorithms import FINETUNED
from common.learning.evaluate import shift_key
from common.wire.messages import FINETUNE_EPOCHS
from common.wire.validation import PayloadError, read_count

from .base import ClientAlgorithm

MAX_FINETUNE_EPOCHS = 100  # the run-config bound; a message asking for more is refused


class NewcomerClient(ClientAlgorithm):
    """Evaluation of the newcomer model; its fine-tuned copy is thrown away (no state is kept)."""

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """A held-out client is never trained; a training message for it is refused."""
        raise PayloadError("a held-out client never trains")

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """Accuracy of the received model, and after `finetune-epochs` of local training on this client's data."""
        epochs = read_count(self.instructions(content), FINETUNE_EPOCHS, allow_zero=True)
        if epochs > MAX_FINETUNE_EPOCHS:
            raise PayloadError(f"finetune-epochs = {epochs} is above {MAX_FINETUNE_EPOCHS}")
        # the algorithm's client half fills in what the newcomer record leaves out (a split method's own part)
        from . import client_class

        model = client_class(self.cfg.algorithm)(self.env).newcomer_model(content)
        received = self.evaluate_model(model)
        extra: dict[str, float] = {}
        if epochs:
            self.train_locally(model, server_round, "newcomer", replace(self.settings(server_round), epochs=epochs))
            extra = {
                FINETUNED.prefix + shift_key(d): acc
                for d, acc in self.evaluate_model(model, shifted_sets=False).shift_accuracy.items()
            }
        return self.eval_reply(received, extra)
