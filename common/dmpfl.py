"""DM-PFL math (papers/001 Sec. 3): phase schedule, Eq. 4 composition, Eq. 5 aggregation, global mask, Alg. 4."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from .evaluate import entropy
from .masks import topk_mask


def phase_schedule(num_rounds: int, iterations: int) -> list[int]:
    """Phase (1, 2 or 3) of each round 1..T: `iterations` cycles, each split equally into phases 1, 2, 3.

    Segment k of the 3*iterations segments holds rounds round(k*T/(3I)) + 1 .. round((k+1)*T/(3I)).
    iterations = 0 means phase 1 only (the paper's ablation).
    """
    if iterations <= 0:
        return [1] * num_rounds
    segments = 3 * iterations
    bounds = [round(k * num_rounds / segments) for k in range(segments + 1)]
    phases = []
    for k in range(segments):
        phases.extend([k % 3 + 1] * (bounds[k + 1] - bounds[k]))
    return phases


def compose_personal(w_g: np.ndarray, m_g: np.ndarray, w_c: np.ndarray, m_c: np.ndarray) -> np.ndarray:
    """Eq. 4: theta_c = w_g * (m_g AND m_c) + w_c * (m_c AND NOT m_g); zero outside m_c."""
    return np.where(m_c & m_g, w_g, np.where(m_c, w_c, 0.0)).astype(np.float32)


def compose_global(w_g: np.ndarray, m_g: np.ndarray) -> np.ndarray:
    """theta_g = w_g * m_g."""
    return np.where(m_g, w_g, 0.0).astype(np.float32)


def aggregate_masked(w_g: np.ndarray, weights: Sequence[np.ndarray], masks: Sequence[np.ndarray],
                     sizes: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 5 for one layer: on the union of the masks, sum_c |D_c| w_c m_c / sum_c |D_c| m_c; elsewhere the old w_g.

    Returns (new w_g, vote counts = number of client masks holding each position).
    """
    numerator = np.zeros(w_g.shape, np.float64)
    denominator = np.zeros(w_g.shape, np.float64)
    votes = np.zeros(w_g.shape, np.int64)
    for w_c, m_c, size in zip(weights, masks, sizes, strict=True):
        numerator += size * np.where(m_c, w_c, 0.0)
        denominator += size * m_c
        votes += m_c
    covered = denominator > 0
    out = np.where(covered, numerator / np.where(covered, denominator, 1.0), w_g)
    return out.astype(np.float32), votes


def select_global_mask(w_g: np.ndarray, votes: np.ndarray, num_received: int, density: float,
                       min_vote_fraction: float) -> np.ndarray:
    """New m_g of one layer: the top `density` fraction of |w_g| among positions with votes > fraction * received.

    Positions failing the vote are never selected, so the layer may end up sparser than `density`.
    """
    eligible = votes > min_vote_fraction * num_received
    return topk_mask(torch.from_numpy(w_g), density, torch.from_numpy(eligible)).numpy()


def aggregate_round(w_g: Mapping[str, np.ndarray], replies: Sequence[tuple[Mapping[str, np.ndarray],
                    Mapping[str, np.ndarray], float]], densities: Mapping[str, float],
                    min_vote_fraction: float) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Phase-1 server step on a whole model: Eq. 5 on masked layers, size-weighted mean on dense ones, new m_g.

    replies: (client weights, client masks of the masked layers, |D_c|) per client.
    """
    new_w: dict[str, np.ndarray] = {}
    new_m: dict[str, np.ndarray] = {}
    sizes = [size for _, _, size in replies]
    for name, old in w_g.items():
        weights = [w[name] for w, _, _ in replies]
        if name in densities:
            new_w[name], votes = aggregate_masked(old, weights, [m[name] for _, m, _ in replies], sizes)
            new_m[name] = select_global_mask(new_w[name], votes, len(replies), densities[name], min_vote_fraction)
        else:
            total = float(sum(sizes))
            summed = np.zeros(old.shape, np.float64)
            for size, weight in zip(sizes, weights):
                summed += size * weight.astype(np.float64)
            new_w[name] = (summed / total).astype(np.float32)
    return new_w, new_m


def adaptive_predict(logits_c: torch.Tensor, logits_g: torch.Tensor, base_entropy_c: float,
                     base_entropy_g: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Alg. 4 per sample: use theta_c when E_c - (1-Sim) BE_c < E_g - (1-Sim) BE_g, else theta_g.

    Entropies and the cosine similarity are taken on the softmax outputs. Returns (predictions, used_personal).
    """
    p_c, p_g = torch.softmax(logits_c, dim=1), torch.softmax(logits_g, dim=1)
    similarity = torch.nn.functional.cosine_similarity(p_c, p_g, dim=1)
    score_c = entropy(p_c) - (1 - similarity) * base_entropy_c
    score_g = entropy(p_g) - (1 - similarity) * base_entropy_g
    use_personal = score_c < score_g
    return torch.where(use_personal, logits_c.argmax(1), logits_g.argmax(1)), use_personal
