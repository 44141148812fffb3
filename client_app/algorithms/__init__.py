"""Client halves by algorithm name, as the specs in common/algorithms.py name them ("module:Class")."""

from __future__ import annotations

from importlib import import_module

from common.algorithms import SPECS

from .base import ClientAlgorithm, ClientEnv


def client_class(algorithm: str) -> type[ClientAlgorithm]:
    """The client half of a registered algorithm (only its module is imported: a device loads one algorithm)."""
    module, _, name = SPECS[algorithm].client.partition(":")
    cls = getattr(import_module(f"{__name__}.{module}"), name)
    if not (isinstance(cls, type) and issubclass(cls, ClientAlgorithm)):
        raise TypeError(f"{SPECS[algorithm].client} is not a ClientAlgorithm")
    return cls


__all__ = ["ClientAlgorithm", "ClientEnv", "client_class"]
