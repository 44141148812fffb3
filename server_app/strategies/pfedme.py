"""pFedMe on the server: FedAvg's average of the clients' local models w_i, then the global model moved by beta
toward it (Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020, Algorithm 1)."""

from __future__ import annotations

from common.algorithms import PFedMeParams
from common.methods.aggregate import server_step

from ..replies import TrainReply
from .fedavg import FedAvgStrategy


class PFedMeStrategy(FedAvgStrategy):
    """w <- (1 - beta) w + beta avg(w_i): the average is FedAvg's (sample-weighted, through the run's robust rule,
    peer bound and central DP, as the authors' code and PFLlib weigh by samples; the paper's is uniform)."""

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """FedAvg's aggregate, then the step of size beta from the previous global model toward it."""
        if not replies:
            return
        previous = self.global_arrays
        super().aggregate(server_round, replies)
        self.global_arrays = server_step(previous, self.global_arrays, self.cfg.params_as(PFedMeParams).pfedme_beta)
