"""FedDST client half: train the sparse global model under its mask; in readjustment rounds prune and regrow."""

from __future__ import annotations

import torch
from flwr.app import RecordDict

from common.methods.masks import prune_and_regrow
from common.wire.messages import ARRAYS, READJUST_RATIO
from common.wire.validation import read_fraction

from .sparse import SparseGlobalClient


class FedDSTClient(SparseGlobalClient):
    """Uploads values on m_g, or (readjustment rounds) its readjusted mask with the weights on it.

    Stages: G = L1 = the received theta_g (nothing personal), L2 = the trained model."""

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Train theta_g under m_g; readjust the mask when the server says so."""
        w_g, m_g = self.refresh_global(content)
        fraction = read_fraction(self.instructions(content), READJUST_RATIO)
        model = self.to_model(self.theta_g(w_g, m_g))
        received = self.snapshot(model)
        collector = self.gradient_collector() if fraction > 0 else None
        stats = self.train_locally(model, server_round, update_masks=self.torch_masks(m_g), on_gradients=collector)
        trained, masks = self.named(model), m_g
        if collector is not None and set(collector.mean()) == set(m_g):
            weights = {n: torch.from_numpy(trained[n]) for n in m_g}
            new_masks, new_weights = prune_and_regrow(weights, collector.mean(), self.torch_masks(m_g), fraction)
            masks = {n: m.numpy() for n, m in new_masks.items()}
            trained.update({n: w.numpy() for n, w in new_weights.items()})
        reply = self.train_reply(
            stats, None, self.densities(masks), stages={"G": received, "L1": received, "L2": model}
        )
        reply[ARRAYS] = self.upload(trained, masks, fraction == 0.0, (w_g, m_g), server_round)
        return reply

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """The sparse global model on the local test data."""
        w_g, m_g = self.refresh_global(content)
        return self.eval_reply(self.evaluate_model(self.to_model(self.theta_g(w_g, m_g))))
