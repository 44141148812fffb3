"""Client halves by algorithm name, as the specs in common/algorithms.py name them ("module:Class")."""

from __future__ import annotations

from typing import cast

from common.algorithms import SPECS, resolve_half

from .base import ClientAlgorithm, ClientEnv


def client_class(algorithm: str) -> type[ClientAlgorithm]:
    """The client half of a registered algorithm (only its module is imported: a device loads one algorithm)."""
    # resolve_half checks the subclass at run time; the cast tells mypy (an abstract base is no concrete type[])
    return cast("type[ClientAlgorithm]", resolve_half(__name__, SPECS[algorithm].client, ClientAlgorithm))


__all__ = ["ClientAlgorithm", "ClientEnv", "client_class"]
