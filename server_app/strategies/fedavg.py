"""FedAvg, FedProx and FedAvg+FT on the server: sample-weighted averaging of full models."""

from __future__ import annotations

from flwr.app import ConfigRecord

from common.algorithms import FedProxParams
from common.wire.messages import PROX_MU

from .base import PFLStrategy


class FedAvgStrategy(PFLStrategy):
    """FedAvg (McMahan et al., 2017): w <- sum_k n_k w_k / sum_k n_k over the round's replies. FedAvg+FT runs
    it too: its clients fine-tune before evaluating."""


class FedProxStrategy(FedAvgStrategy):
    """FedProx (Li et al., 2020): FedAvg aggregation; clients add (mu/2)||w - w_global||^2, mu sent with each round."""

    def round_config(self, server_round: int, partition_id: int) -> ConfigRecord:
        """Adds the proximal coefficient `prox-mu`."""
        config = super().round_config(server_round, partition_id)
        config[PROX_MU] = self.cfg.params_as(FedProxParams).proximal_mu
        return config
