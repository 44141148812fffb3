"""FLIU individualized update (FLIU [arXiv:2510.24503] Eq. 3) and its adaptive personalization factor (Eq. 4).

Paper: Hussaini, Theiss, Stein, "Local Performance vs. Out-of-Distribution Generalization: An Empirical Analysis of
Personalized Federated Learning in Heterogeneous Data Environments", arXiv:2510.24503."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# (multiple m, gamma): gamma when n_k > m * n / K, checked from the largest m down; 0.1 otherwise.
_GAMMA_STEPS = ((10.0, 0.9), (5.0, 0.75), (1.0, 0.5), (0.5, 0.25))
_GAMMA_FLOOR = 0.1


def adaptive_gamma(n_k: int, n_total: int, num_clients: int) -> float:
    """gamma_k(n_k) of Eq. 4 with n the total sample count and K the number of clients (strict >)."""
    if num_clients < 1 or n_total < 0 or n_k < 0:
        raise ValueError(
            f"need num_clients >= 1 and non-negative counts, got n_k={n_k}, "
            f"n_total={n_total}, num_clients={num_clients}"
        )
    # n_k > m * n / K  <=>  n_k * K > m * n: no division, so the boundaries are exact for integers.
    for multiple, gamma in _GAMMA_STEPS:
        if n_k * num_clients > multiple * n_total:
            return gamma
    return _GAMMA_FLOOR


def individualized_update(
    theta_k: Sequence[np.ndarray], theta_global: Sequence[np.ndarray], gamma: float
) -> list[np.ndarray]:
    """Layer-wise gamma * theta_k + (1 - gamma) * Theta, computed in float64, returned as float32."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    if len(theta_k) != len(theta_global):
        raise ValueError(f"local model has {len(theta_k)} layers, global model {len(theta_global)}")
    out = []
    for i, (local, glob) in enumerate(zip(theta_k, theta_global)):
        if np.shape(local) != np.shape(glob):
            raise ValueError(f"layer {i}: local shape {np.shape(local)} != global shape {np.shape(glob)}")
        mixed = gamma * np.asarray(local, np.float64) + (1.0 - gamma) * np.asarray(glob, np.float64)
        out.append(mixed.astype(np.float32))
    return out
