"""FLIU client half: individualized update theta_k <- gamma theta_k + (1 - gamma) Theta, then local training.

Paper: Hussaini, Theiss, Stein, "Local Performance vs. Out-of-Distribution Generalization: An Empirical Analysis of
Personalized Federated Learning in Heterogeneous Data Environments", arXiv:2510.24503."""

from __future__ import annotations

from dataclasses import replace

from flwr.app import RecordDict

from common.algorithms import FLIUParams
from common.learning.models import SplitModel, get_arrays
from common.learning.train import TrainSettings
from common.methods.fliu import adaptive_gamma, individualized_update
from common.wire.messages import NUM_CLIENTS, TOTAL_SAMPLES
from common.wire.validation import PayloadError, read_count

from .base import ClientAlgorithm
from .local import PERSONAL


class FLIUClient(ClientAlgorithm):
    """Keeps its last locally trained model theta_k; stages: G = Theta, L1 = individualized, L2 = trained."""

    def settings(self, server_round: int) -> TrainSettings:
        """FLIU trains locally with Adam (the FLIU paper's Sec. IV) at the configured lr and its per-round decay."""
        return replace(super().settings(server_round), optimizer="adam")

    def gamma(self, content: RecordDict) -> float:
        """The fixed `fliu-gamma`, or gamma_k(n_k) of Eq. 4 from the n and K the server sent."""
        fixed = self.cfg.params_as(FLIUParams).fliu_gamma
        if fixed >= 0.0:
            return fixed
        config = self.instructions(content)
        try:
            n_total = read_count(config, TOTAL_SAMPLES)
            num_clients = read_count(config, NUM_CLIENTS)
        except PayloadError as exc:
            raise PayloadError(f"FLIU needs the federation's sample count: {exc}") from None
        return adaptive_gamma(self.env.data.num_train, n_total, num_clients)

    def individualized(self, global_model: SplitModel, content: RecordDict) -> SplitModel:
        """The model after the individualized update (Theta itself before the first local training)."""
        own = self.env.state.load_arrays(PERSONAL)
        arrays = get_arrays(global_model)
        return self.new_model(arrays if own is None else individualized_update(own, arrays, self.gamma(content)))

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Individualize, train locally, keep and upload theta_k."""
        global_model = self.received_model(content)
        model = self.individualized(global_model, content)
        before = self.snapshot(model)
        stats = self.train_locally(model, server_round)
        self.env.state.save_arrays(PERSONAL, get_arrays(model))
        return self.train_reply(stats, model, stages={"G": global_model, "L1": before, "L2": model})

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """The model a client would use on receiving Theta: its individualized update (stage L1)."""
        return self.eval_reply(self.evaluate_model(self.individualized(self.received_model(content), content)))
