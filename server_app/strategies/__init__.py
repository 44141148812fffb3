"""Registry of server strategies by algorithm name: adding an algorithm is one line here."""

from __future__ import annotations

from typing import Any

from .base import PFLStrategy
from .fedavg import FedAvgFTStrategy, FedAvgStrategy, FedProxStrategy
from .dmpfl import DMPFLStrategy
from .fedamp import FedAMPStrategy, HeurFedAMPStrategy
from .feddst import FedDSTStrategy
from .fedfomo import FedFomoStrategy
from .fliu import FLIUStrategy
from .local import LocalStrategy

STRATEGIES: dict[str, type[PFLStrategy]] = {
    cls.name: cls for cls in (FedAvgStrategy, FedProxStrategy, FedAvgFTStrategy, LocalStrategy, FedDSTStrategy,
                              DMPFLStrategy, FedAMPStrategy, HeurFedAMPStrategy, FLIUStrategy, FedFomoStrategy)
}


def algorithm_config_keys() -> dict[str, Any]:
    """Algorithm-specific run-config keys (with defaults) of every registered strategy."""
    keys: dict[str, Any] = {}
    for cls in STRATEGIES.values():
        keys.update(cls.extra_config)
    return keys
