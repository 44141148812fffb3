"""FedAMP / HeurFedAMP attention weights and personalized cloud models on a (clients x params) matrix."""

from __future__ import annotations

import numpy as np

# Columns of W converted to float64 at a time for the Gram matrix: bounds the extra memory to
# m * _GRAM_CHUNK * 8 bytes instead of a float64 copy of the whole matrix.
_GRAM_CHUNK = 1 << 16


def _check_models(W: np.ndarray) -> np.ndarray:
    W = np.asarray(W)
    if W.ndim != 2 or W.shape[0] < 1:
        raise ValueError(f"expected a (clients x params) matrix, got shape {W.shape}")
    return W


def _gram(W: np.ndarray) -> np.ndarray:
    """G = W W^T accumulated in float64, column block by column block."""
    W = _check_models(W)
    G = np.zeros((W.shape[0], W.shape[0]), dtype=np.float64)
    for start in range(0, W.shape[1], _GRAM_CHUNK):
        block = W[:, start:start + _GRAM_CHUNK].astype(np.float64)
        G += block @ block.T
    return G


def _distances_from_gram(G: np.ndarray) -> np.ndarray:
    sq = np.diag(G)
    D = np.maximum(sq[:, None] + sq[None, :] - 2.0 * G, 0.0)
    np.fill_diagonal(D, 0.0)
    return D


def _cosine_from_gram(G: np.ndarray) -> np.ndarray:
    norms = np.sqrt(np.maximum(np.diag(G), 0.0))
    denom = norms[:, None] * norms[None, :]
    C = np.divide(G, denom, out=np.zeros_like(G), where=denom > 0)
    return np.clip(C, -1.0, 1.0)


def pairwise_sq_distances(W: np.ndarray) -> np.ndarray:
    """(m x m) matrix of ||w_i - w_j||^2 from one Gram matrix (float64, clipped at 0, zero diagonal)."""
    return _distances_from_gram(_gram(W))


def pairwise_cosine(W: np.ndarray) -> np.ndarray:
    """(m x m) matrix of cos(w_i, w_j) from one Gram matrix; a zero-norm row has cosine 0 with all."""
    return _cosine_from_gram(_gram(W))


def _active_mask(active: np.ndarray | None, m: int) -> np.ndarray:
    if active is None:
        return np.ones(m, dtype=bool)
    mask = np.asarray(active, dtype=bool)
    if mask.shape != (m,):
        raise ValueError(f"active must hold one flag per client ({m}), got shape {mask.shape}")
    return mask


def _peer_mask(mask: np.ndarray) -> np.ndarray:
    """peer[i, j]: j != i and both clients active (j may send a message to i)."""
    peers = mask[:, None] & mask[None, :]
    np.fill_diagonal(peers, False)
    return peers


def fedamp_weights(W: np.ndarray, alpha_k: float, sigma: float,
                   active: np.ndarray | None = None) -> tuple[np.ndarray, bool]:
    """FedAMP xi (Eq. 4/6 with A(t) = 1 - exp(-t/sigma)); True when some row needed the guard.

    xi_ij = alpha_k * exp(-||w_i - w_j||^2 / sigma) / sigma for j != i, xi_ii = 1 - sum_{j != i} xi_ij.
    A row whose off-diagonal sum exceeds 1 is rescaled to sum 1 with xi_ii = 0 (the paper's step
    would give client i a negative self weight). Inactive clients take no part: their row is the
    identity and no active row gives them weight.
    """
    if alpha_k < 0 or sigma <= 0:
        raise ValueError(f"need alpha_k >= 0 and sigma > 0, got alpha_k={alpha_k}, sigma={sigma}")
    D = pairwise_sq_distances(W)
    peers = _peer_mask(_active_mask(active, D.shape[0]))
    xi = np.where(peers, alpha_k * np.exp(-D / sigma) / sigma, 0.0)
    off = xi.sum(axis=1)
    over = off > 1.0
    xi[over] /= off[over, None]
    np.fill_diagonal(xi, np.where(over, 0.0, 1.0 - off))
    return xi, bool(over.any())


def heurfedamp_weights(W: np.ndarray, sigma: float, tau: float, active: np.ndarray | None = None) -> np.ndarray:
    """HeurFedAMP weights (Alg. 2, Eq. 10-11): 1 - tau on the diagonal, tau * softmax_j(sigma cos) off it.

    A client with no active peer (or an inactive one) keeps weight 1 on itself.
    """
    if sigma <= 0 or not 0.0 <= tau <= 1.0:
        raise ValueError(f"need sigma > 0 and 0 <= tau <= 1, got sigma={sigma}, tau={tau}")
    C = pairwise_cosine(W)
    peers = _peer_mask(_active_mask(active, C.shape[0]))
    logits = np.where(peers, sigma * C, -np.inf)
    has_peer = peers.any(axis=1)
    row_max = np.where(has_peer, logits.max(axis=1, initial=-np.inf), 0.0)
    e = np.where(peers, np.exp(logits - row_max[:, None]), 0.0)
    total = e.sum(axis=1, keepdims=True)
    xi = tau * np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    np.fill_diagonal(xi, np.where(has_peer, 1.0 - tau, 1.0))
    return xi


def cloud_models(xi: np.ndarray, W: np.ndarray, rows: list[int] | None = None) -> np.ndarray:
    """U = xi W (only `rows` of it when given) as one float32 GEMM; row i is client i's cloud model u_i."""
    W = _check_models(W)
    xi = np.asarray(xi)
    if xi.shape != (W.shape[0], W.shape[0]):
        raise ValueError(f"xi has shape {xi.shape}, expected {(W.shape[0], W.shape[0])}")
    weights = xi if rows is None else xi[np.asarray(rows, dtype=np.int64)]
    # float32 GEMM: a float64 one would first copy the whole (m x d) model matrix.
    return weights.astype(np.float32) @ W.astype(np.float32, copy=False)
