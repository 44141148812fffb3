"""Registry of client halves by algorithm name: adding an algorithm is one line here."""

from __future__ import annotations

from .base import ClientAlgorithm, ClientEnv
from .fedavg import FedAvgClient, FedAvgFTClient, FedProxClient
from .dmpfl import DMPFLClient
from .fedamp import FedAMPClient, HeurFedAMPClient
from .feddst import FedDSTClient
from .fedfomo import FedFomoClient
from .fliu import FLIUClient
from .local import LocalClient

ALGORITHMS: dict[str, type[ClientAlgorithm]] = {
    cls.name: cls for cls in (FedAvgClient, FedProxClient, FedAvgFTClient, LocalClient, FedDSTClient, DMPFLClient,
                              FedAMPClient, HeurFedAMPClient, FLIUClient, FedFomoClient)
}

__all__ = ["ALGORITHMS", "ClientAlgorithm", "ClientEnv"]
