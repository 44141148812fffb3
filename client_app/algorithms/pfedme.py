"""pFedMe's client half: from the received global model, each mini-batch takes K inner steps on the personal model
theta (cross-entropy + (lambda/2)||theta - w_i||^2, warm-started where the last batch left it), then moves the local
model w_i toward theta; w_i is uploaded, theta kept on the device and evaluated (Dinh, Tran, Nguyen, "Personalized
Federated Learning with Moreau Envelopes", NeurIPS 2020, Algorithm 1)."""

from __future__ import annotations

import dataclasses

from flwr.app import RecordDict

from common.algorithms import GLOBAL, PFedMeParams
from common.learning.models import get_arrays, set_arrays
from common.methods.pfedme import MoreauEnvelope

from .base import ClientAlgorithm

PERSONAL = "pfedme/personal"  # theta as this client's last local training left it


class PFedMeClient(ClientAlgorithm):
    """Trains theta (inner steps at `pfedme-personal-lr`) and w_i (outer step at the run's lr) over `local-epochs`
    of mini-batches; uploads w_i for the server's average; evaluates theta (the received global model until the
    client has trained) and the received model ('global-' row)."""

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Local epochs of (K inner steps, one outer step) per mini-batch; upload w_i, keep theta."""
        params = self.cfg.params_as(PFedMeParams)
        theta = self.received_model(content)
        received = self.snapshot(theta)
        settings = self.settings(server_round)
        envelope = MoreauEnvelope(theta, params.pfedme_lambda, settings.lr)
        inner = dataclasses.replace(settings, lr=params.pfedme_personal_lr, steps_per_batch=params.pfedme_k)
        stats = self.train_locally(
            theta, server_round, settings=inner, extra_losses=[envelope.term], after_batch=envelope.outer_step
        )
        self.env.state.save_arrays(PERSONAL, get_arrays(theta))
        personal = self.snapshot(theta)
        local = envelope.local_state()
        with_local = {name: local.get(name, value) for name, value in theta.state_dict().items()}
        set_arrays(theta, [value.detach().cpu().numpy() for value in with_local.values()])
        # every inner step is a forward and backward pass of the mini-batch: K per sample and epoch
        flops = self.train_flops(stats) * params.pfedme_k
        return self.train_reply(stats, theta, stages={"G": received, "L1": received, "L2": personal}, flops=flops)

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """theta (main accuracy) and the received global model ('global-' row)."""
        w = self.received_model_to_read(content)
        theta = self.stored_model(PERSONAL, default=get_arrays(w))
        return self.eval_reply(self.evaluate_model(theta), self.row(GLOBAL, w))
