"""MOON's client half: FedAvg's local training plus the model-contrastive term that pulls the model's representation
toward the received global model's and away from this client's previous local model's (Li, He, Song,
"Model-Contrastive Federated Learning", CVPR 2021, Algorithm 1). The previous local model stays on the device.

Representations are the model's feature extractor output (`body`), as PFLlib's MOON takes them; the paper adds a
projection head (two linear layers) on top, which this project's models do not have."""

from __future__ import annotations

import copy

from flwr.app import RecordDict

from common.algorithms import MoonParams
from common.learning.models import get_arrays
from common.methods.moon import model_contrastive

from .base import ClientAlgorithm

PREVIOUS = "moon/previous"  # the model this client's last local training ended with


class MoonClient(ClientAlgorithm):
    """Trains the received global model with cross-entropy + mu * the contrastive loss; keeps the trained model as
    the next round's previous model (the common initialization before the first round, as MOON's code and PFLlib);
    uploads the model (FedAvg's aggregation)."""

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Train with the contrastive term, keep the result, upload it."""
        params = self.cfg.params_as(MoonParams)
        model = self.received_model(content)
        received = self.snapshot(model)
        global_body = copy.deepcopy(model.body).eval()
        previous_body = self.stored_model(PREVIOUS).body.eval()
        term = model_contrastive(global_body, previous_body, params.moon_mu, params.moon_tau)
        stats = self.train_locally(model, server_round, extra_losses=[term])
        self.env.state.save_arrays(PREVIOUS, get_arrays(model))
        # every step also runs the two fixed feature extractors forward
        flops = self.train_flops(stats) + 2 * self.forward_flops(stats, "body.")
        return self.train_reply(stats, model, stages={"G": received, "L1": received, "L2": model}, flops=flops)
