"""FLIU server half (the FLIU paper's Alg. 1): average the clients' models; each client individualizes the result.

Paper: Hussaini, Theiss, Stein, "Local Performance vs. Out-of-Distribution Generalization: An Empirical Analysis of
Personalized Federated Learning in Heterogeneous Data Environments", arXiv:2510.24503."""

from __future__ import annotations

from flwr.app import ConfigRecord

from common.algorithms import FLIUParams
from common.wire.messages import NUM_CLIENTS, TOTAL_SAMPLES

from ..replies import TrainReply
from .base import PFLStrategy


class FLIUStrategy(PFLStrategy):
    """Theta^t = (1/K) sum_k theta_k (or sample-weighted); sends n and K so clients compute gamma_k(n_k) (Eq. 4)."""

    def round_config(self, server_round: int, partition_id: int) -> ConfigRecord:
        """Adds n (all clients' training samples, each count capped as in the weighted averages) and K (clients) for
        the adaptive gamma."""
        config = super().round_config(server_round, partition_id)
        config[TOTAL_SAMPLES] = round(self.clients.weighted_total())  # counts capped as in the averages
        config[NUM_CLIENTS] = len(self.clients)
        return config

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """Uniform average of the round's models (Alg. 1), or weighted by sample counts."""
        uniform = self.cfg.params_as(FLIUParams).fliu_weighting == "uniform"
        weights = [1.0 if uniform else r.weight for r in replies]
        self.global_arrays = self.average(replies, weights, self.global_arrays)
