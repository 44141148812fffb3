"""FedAMP / HeurFedAMP client half: train toward the personalized cloud model u_i with a proximal term.

Paper: Huang et al., "Personalized Federated Learning: An Attentive Collaboration Approach" (FedAMP),
arXiv:2007.03797."""

from __future__ import annotations

from dataclasses import replace

from flwr.app import RecordDict

from common.algorithms import CLOUD, AMPParams
from common.learning.models import get_arrays
from common.learning.train import ProximalStep
from common.wire.messages import PRETRAIN

from .base import ClientAlgorithm
from .local import PERSONAL

CLOUD_MODEL = "cloud"


class FedAMPClient(ClientAlgorithm):
    """Minimizes F_i(w) + (lambda / (2 alpha_k)) ||w - u_i||^2 from u_i (the FedAMP paper's Eq. 5); keeps w_i and u_i.

    The proximal term is applied in closed form after each SGD step (common.learning.train.ProximalStep), not as a
    gradient: with the paper's decaying alpha_k the coefficient grows 10x per decay, and the gradient form
    diverges once lr * lambda / alpha_k > 2 (after round 180 of the paper's schedule at lr 0.05).

    A pre-training message (config 'pretrain') trains `pretrain-epochs` from the common initialization.
    """

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Pre-train, or train from u_i with the proximal pull toward it; upload w_i."""
        model = self.received_model(content)
        settings = self.settings(server_round)
        pull: ProximalStep | None = None
        if self.instructions(content).get(PRETRAIN, False) is True:
            settings = replace(settings, epochs=self.cfg.params_as(AMPParams).pretrain_epochs)
        else:
            self.env.state.save_arrays(CLOUD_MODEL, get_arrays(model))
            pull = ProximalStep.toward(model, self.proximal_mu(content))
        cloud = self.snapshot(model)
        stats = self.train_locally(
            model, server_round, "pretrain" if pull is None else "train", settings, proximal=pull
        )
        self.env.state.save_arrays(PERSONAL, get_arrays(model))
        return self.train_reply(stats, model, stages={"L1": cloud, "L2": model})

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """The local model w_i (main accuracy) and the last received cloud model u_i ('cloud-' metrics)."""
        has_cloud = self.env.state.load_arrays(CLOUD_MODEL) is not None
        rows = self.row(CLOUD, self.stored_model(CLOUD_MODEL)) if has_cloud else {}
        return self.eval_reply(self.evaluate_model(self.stored_model(PERSONAL)), rows)
