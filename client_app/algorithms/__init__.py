"""Registry of client halves by algorithm name: adding an algorithm is one line here."""

from __future__ import annotations

from .base import ClientAlgorithm, ClientEnv
from .fedavg import FedAvgClient, FedAvgFTClient, FedProxClient
from .local import LocalClient

ALGORITHMS: dict[str, type[ClientAlgorithm]] = {
    cls.name: cls for cls in (FedAvgClient, FedProxClient, FedAvgFTClient, LocalClient)
}

__all__ = ["ALGORITHMS", "ClientAlgorithm", "ClientEnv"]
