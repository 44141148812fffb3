"""Label noise and attackers for robustness studies: which clients are dirty or attack (a seeded choice), which
of their training labels get flipped or shifted."""

from __future__ import annotations

import numpy as np


def seeded_client_ids(num_clients: int, fraction: float, seed: int) -> frozenset[int]:
    """A seeded choice of round(fraction * num_clients) client ids (dirty clients, attackers)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"a fraction of the clients must lie in [0, 1], got {fraction}")
    count = int(round(fraction * num_clients))
    rng = np.random.default_rng(seed)
    return frozenset(int(i) for i in rng.choice(num_clients, size=count, replace=False))


def flip_labels(labels: np.ndarray, fraction: float, num_classes: int, seed: int) -> np.ndarray:
    """A copy of `labels` with exactly round(fraction * n) of them replaced by a different, uniformly drawn class."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"dirty-fraction must lie in [0, 1], got {fraction}")
    if num_classes < 2:
        raise ValueError("flipping labels needs at least two classes")
    out = np.array(labels, copy=True)
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(out), size=int(round(fraction * len(out))), replace=False)
    # An offset in 1..C-1 modulo C always gives another class, uniformly over the other C-1.
    offsets = rng.integers(1, num_classes, size=len(chosen))
    out[chosen] = (out[chosen] + offsets) % num_classes
    return out


def shift_labels(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Every label moved to the next class (an attacker's target model learns y -> y + 1 mod C)."""
    return (np.asarray(labels) + 1) % num_classes
