"""Server halves by algorithm name, as the specs in common/algorithms.py name them ("module:Class")."""

from __future__ import annotations

from importlib import import_module

from common.algorithms import SPECS

from .base import PFLStrategy


def strategy_class(algorithm: str) -> type[PFLStrategy]:
    """The server half of a registered algorithm (its module is imported on first use)."""
    module, _, name = SPECS[algorithm].server.partition(":")
    cls = getattr(import_module(f"{__name__}.{module}"), name)
    if not (isinstance(cls, type) and issubclass(cls, PFLStrategy)):
        raise TypeError(f"{SPECS[algorithm].server} is not a PFLStrategy")
    return cls


__all__ = ["PFLStrategy", "strategy_class"]
