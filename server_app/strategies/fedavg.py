"""FedAvg and FedProx on the server: sample-weighted averaging of full models (FedProx differs on clients)."""

from __future__ import annotations

from .base import PFLStrategy


class FedAvgStrategy(PFLStrategy):
    """FedAvg (McMahan et al., 2017): w <- sum_k n_k w_k / sum_k n_k over the round's replies."""

    name = "fedavg"


class FedProxStrategy(FedAvgStrategy):
    """FedProx (Li et al., 2020): FedAvg aggregation; clients add (mu/2)||w - w_global||^2 (run-config proximal-mu)."""

    name = "fedprox"


class FedAvgFTStrategy(FedAvgStrategy):
    """FedAvg+FT: FedAvg training; each client fine-tunes the global model locally before every evaluation."""

    name = "fedavg-ft"
