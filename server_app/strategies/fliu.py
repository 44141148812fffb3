"""FLIU server half (papers/003 Alg. 1): average the clients' models; each client individualizes the result."""

from __future__ import annotations

from typing import Any

from flwr.app import ConfigRecord

from common.aggregate import weighted_average
from common.config import ConfigError

from .base import PFLStrategy, TrainReply

WEIGHTINGS = ("uniform", "samples")


class FLIUStrategy(PFLStrategy):
    """Theta^t = (1/K) sum_k theta_k (or sample-weighted); sends n and K so clients compute gamma_k(n_k) (Eq. 4)."""

    name = "fliu"
    extra_config = {"fliu-gamma": -1.0, "fliu-weighting": "uniform"}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        weighting = str(self.cfg.extra.get("fliu-weighting", "uniform")).lower()
        if weighting not in WEIGHTINGS:
            raise ConfigError(f"run-config 'fliu-weighting' = {weighting!r} is not valid; "
                              f"allowed values: {', '.join(WEIGHTINGS)}")
        gamma = float(self.cfg.extra.get("fliu-gamma", -1.0))
        if gamma != -1.0 and not 0.0 <= gamma <= 1.0:
            raise ConfigError(f"run-config 'fliu-gamma' = {gamma} must be -1 (adaptive, Eq. 4) or lie in [0, 1]")
        self.weighting = weighting

    def round_config(self, server_round: int, partition_id: int) -> ConfigRecord:
        """Adds n (all clients' training samples) and K (clients) for the adaptive gamma."""
        config = super().round_config(server_round, partition_id)
        config["total-samples"] = sum(c.num_train for c in self.clients.values())
        config["num-clients"] = len(self.clients)
        return config

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """Uniform average of the round's models (Alg. 1), or weighted by sample counts."""
        weights = [1.0 if self.weighting == "uniform" else float(r.num_examples) for r in replies]
        self.global_arrays = weighted_average([r.arrays for r in replies], weights)
