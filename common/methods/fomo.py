"""FedFomo math (Zhang et al., 2021): peer weights from validation-loss gain, the combined model, peer choice."""

from __future__ import annotations

import numpy as np

WEIGHT_KEY = "fomo-weight-{}"  # reply metric: the client's weight for the k-th peer it received


def fomo_weights(own_loss: float, peer_losses: list[float], distances: list[float]) -> list[float]:
    """w_n = max(0, (L(theta_i) - L(theta_n)) / ||theta_n - theta_i||), normalized to sum 1 (all 0 if none helps)."""
    raw = [max(0.0, (own_loss - loss) / dist) if dist > 0 else 0.0 for loss, dist in zip(peer_losses, distances)]
    total = sum(raw)
    return [w / total for w in raw] if total > 0 else [0.0] * len(raw)


def fomo_combine(own: list[np.ndarray], peers: list[list[np.ndarray]], weights: list[float]) -> list[np.ndarray]:
    """theta_i + sum_n w_n (theta_n - theta_i), layer by layer (float64 sums, float32 result)."""
    out = []
    for i, layer in enumerate(own):
        acc = np.asarray(layer, np.float64).copy()
        for peer, w in zip(peers, weights):
            if w:
                acc += w * (np.asarray(peer[i], np.float64) - layer)
        out.append(acc.astype(np.float32))
    return out


def choose_peers(
    affinity_row: np.ndarray, candidates: np.ndarray, count: int, epsilon: float, rng: np.random.Generator
) -> list[int]:
    """Epsilon-greedy choice of `count` peers: random with probability epsilon, else the highest affinities
    (ties broken at random)."""
    candidates = np.asarray(candidates, dtype=np.int64)
    count = min(count, len(candidates))
    if count == 0:
        return []
    if rng.random() < epsilon:
        return sorted(int(c) for c in rng.choice(candidates, size=count, replace=False))
    order = np.lexsort((rng.random(len(candidates)), -affinity_row[candidates]))
    return sorted(int(c) for c in candidates[order[:count]])
