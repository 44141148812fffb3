"""Ditto client half (Li et al., 2021): the global model trained as in FedAvg, plus a personal model v trained
with (lambda/2) ||v - w||^2 toward the received global model w; v stays on the device."""

from __future__ import annotations

from flwr.app import RecordDict

from common.algorithms import GLOBAL, DittoParams
from common.learning.models import get_arrays
from common.learning.train import proximal_loss

from .base import ClientAlgorithm
from .local import PERSONAL


class DittoClient(ClientAlgorithm):
    """Uploads the trained global model; keeps v. Evaluation reports v, and the global model as its own row."""

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """`local-epochs` on w (uploaded), then as many on v with the proximal pull toward the received w."""
        w = self.received_model(content)
        received = self.snapshot(w)
        pull = proximal_loss(dict(w.named_parameters()), self.cfg.params_as(DittoParams).ditto_lambda)
        v = self.stored_model(PERSONAL, default=get_arrays(w))
        before = self.snapshot(v)
        global_stats = self.train_locally(w, server_round)
        personal_stats = self.train_locally(v, server_round, "personal", extra_losses=[pull])
        self.env.state.save_arrays(PERSONAL, get_arrays(v))
        flops = self.train_flops(global_stats) + self.train_flops(personal_stats)
        return self.train_reply(global_stats, w, stages={"G": received, "L1": before, "L2": v}, flops=flops)

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """The personal model v (main accuracy) and the received global model ('global-' row)."""
        w = self.received_model_to_read(content)
        v = self.stored_model(PERSONAL, default=get_arrays(w))
        return self.eval_reply(self.evaluate_model(v), self.row(GLOBAL, w))
