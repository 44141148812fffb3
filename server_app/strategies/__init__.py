"""Server halves by algorithm name, as the specs in common/algorithms.py name them ("module:Class")."""

from __future__ import annotations

from typing import cast

from common.algorithms import SPECS, resolve_half

from .base import PFLStrategy


def strategy_class(algorithm: str) -> type[PFLStrategy]:
    """The server half of a registered algorithm (its module is imported on first use)."""
    return cast("type[PFLStrategy]", resolve_half(__name__, SPECS[algorithm].server, PFLStrategy))


__all__ = ["PFLStrategy", "strategy_class"]
