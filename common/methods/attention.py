"""FedAMP / HeurFedAMP attention weights and personalized cloud models on a (clients x params) matrix.

Paper: Huang et al., "Personalized Federated Learning: An Attentive Collaboration Approach" (FedAMP),
arXiv:2007.03797."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from common.storage.pages import block_threads, map_column_blocks, new_store, release_pages, row_blocks

# Bytes of a float64 column block of the Gram matrix (a float32 one for cloud models: half the columns) handled by
# one thread at a time: bounds the extra memory instead of a float64 copy of the whole (m x d) matrix. Fixed, not
# scaled by the thread count: the blocks decide the sums' order, so the numbers do not depend on the machine.
_GRAM_BLOCK_BYTES = 32 << 20

R = TypeVar("R")

# A torch device (a GPU) the column blocks' products run on, set by `products_on`; None: numpy's BLAS on the CPU.
_PRODUCTS_DEVICE: str | None = None


@contextmanager
def products_on(device: str | None) -> Iterator[None]:
    """Within the block, the column blocks' products of gram_rows, gram_among and mix_rows run on the torch `device`
    (the server's GPU): each block goes there as float32, its product is made there (Gram rows in float64, mixes
    in float32) and comes back, and the blocks are summed in their order as on the CPU. None keeps numpy's BLAS."""
    global _PRODUCTS_DEVICE
    previous, _PRODUCTS_DEVICE = _PRODUCTS_DEVICE, device
    try:
        yield
    finally:
        _PRODUCTS_DEVICE = previous


def _on_device(array: np.ndarray, device: str, dtype: Any = None) -> Any:
    """A numpy array as a torch tensor on `device` (in `dtype` when given), for reading only: it may share the
    array's memory where no copy is needed (the CPU, the same dtype), so it must be used before the array changes."""
    import torch

    with warnings.catch_warnings():  # only read: torch's warning about tensors over read-only memory is moot
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(np.asarray(array))
    return tensor.to(device=device, dtype=dtype or tensor.dtype)


def _device_gram_block(block: np.ndarray, picked: np.ndarray | None, device: str) -> np.ndarray:
    """B[picked] B^T (the symmetric B B^T when `picked` is None) of a float32 block, in float64 on `device`."""
    import torch

    on = _on_device(block, device, torch.float64)
    rows = on if picked is None else on[_on_device(picked, device)]
    return (rows @ on.T).cpu().numpy()


def _check_models(W: np.ndarray) -> np.ndarray:
    W = np.asanyarray(W)  # keeps a memmap a memmap (its pages are released as they are read)
    if W.ndim != 2 or W.shape[0] < 1:
        raise ValueError(f"expected a (clients x params) matrix, got shape {W.shape}")
    return W


def _over_column_blocks(
    W: np.ndarray, itemsize: int, work: Callable[[tuple[int, np.ndarray]], R], rows: Sequence[int] | None = None
) -> Iterator[R]:
    """work((start, columns)) for W's column blocks (of the given `rows` only, when given; _GRAM_BLOCK_BYTES at
    `itemsize` bytes a value), on block_threads() threads, results in the blocks' order."""
    width = max(1024, _GRAM_BLOCK_BYTES // (itemsize * (W.shape[0] if rows is None else max(len(rows), 1))))
    return map_column_blocks(work, W, width, block_threads(), rows)


def _float64_scratch() -> Callable[[np.ndarray], np.ndarray]:
    """A converter of float32 blocks to float64 into one buffer per thread, reused block after block: a fresh
    array per block (tens of MB, each mapped anew and page-faulted in) costs more than its product."""
    local = threading.local()

    def as_float64(block: np.ndarray) -> np.ndarray:
        buffer = getattr(local, "buffer", None)
        if buffer is None or buffer.size < block.size:
            buffer = local.buffer = np.empty(block.size, dtype=np.float64)
        out = buffer[: block.size].reshape(block.shape)
        np.copyto(out, block)
        return out

    return as_float64


def _summed_products(W: np.ndarray, read: Sequence[int] | None, picked: np.ndarray | None) -> np.ndarray:
    """The float64 sum over W's column blocks (of the rows `read` only, when given) of B[picked] B^T, or of the
    symmetric B B^T when `picked` is None: each block's product on block_threads() threads, summed in block order."""
    as_float64, device = _float64_scratch(), _PRODUCTS_DEVICE

    def product(item: tuple[int, np.ndarray]) -> np.ndarray:
        if device is not None:
            return _device_gram_block(item[1], picked, device)
        block = as_float64(item[1])
        return block @ block.T if picked is None else block[picked] @ block.T  # A @ A.T is computed symmetric

    n = W.shape[0] if read is None else len(read)
    out = np.zeros((n if picked is None else len(picked), n), dtype=np.float64)
    for part in _over_column_blocks(W, 8, product, read):
        out += part
    return out


def gram_rows(W: np.ndarray, rows: np.ndarray | list[int] | None = None) -> np.ndarray:
    """(W[rows] W^T) in float64, column block by column block (all rows when `rows` is None), the blocks' products
    on block_threads() threads and summed in block order.

    float64 because squared distances come from ||a||^2 + ||b||^2 - 2ab, which cancels badly in float32. When at
    least half the rows are asked for, the whole symmetric W W^T (m^2 d multiply-adds) is cheaper than k rows of it
    (2 k m d), and its rows are returned.
    """
    W = _check_models(W)
    picked = np.arange(W.shape[0]) if rows is None else np.asarray(rows, dtype=np.int64)
    if 2 * len(picked) >= W.shape[0]:
        whole = _summed_products(W, None, None)
        return whole if rows is None else whole[picked]
    return _summed_products(W, None, picked)


def gram_among(W: np.ndarray, rows: Sequence[int]) -> np.ndarray:
    """W[rows] W[rows]^T in float64 (len(rows)^2 d multiply-adds), column block by column block of those rows only."""
    return _summed_products(_check_models(W), list(rows), None)


def _gram(W: np.ndarray) -> np.ndarray:
    return gram_rows(W)


def model_store(num_clients: int, initial: np.ndarray | None, path: Path | None = None, width: int = 0) -> np.ndarray:
    """(clients x params) float32 rows, each the `initial` model (zeros of `width` values when None): in memory, or
    with `path` a memory-mapped .npy file (the operating system keeps in memory only the pages in use, and can drop
    clean ones under pressure; zeros cost no writes)."""
    if initial is None:
        return (
            np.zeros((num_clients, width), dtype=np.float32)
            if path is None
            else new_store(path, np.float32, (num_clients, width))
        )
    if path is None:
        return np.tile(initial, (num_clients, 1))
    store = new_store(path, np.float32, (num_clients, initial.size))
    step = max(1, _GRAM_BLOCK_BYTES // max(4 * initial.size, 1))
    for start in range(0, num_clients, step):  # block by block: no (clients x params) copy in memory
        store[start : start + step] = initial
        release_pages(store)
    return store


def copy_to_store(W: np.ndarray, path: Path) -> np.ndarray:
    """A new memory-mapped float32 store at `path` holding W's rows, copied block by block (W may itself be
    memory-mapped: neither becomes resident in full)."""
    W = _check_models(W)
    store = new_store(path, np.float32, W.shape)
    start = 0
    for block in row_blocks(W):
        store[start : start + len(block)] = block
        release_pages(store)
        start += len(block)
    return store


class ModelMatrix:
    """Every client's latest model as one float32 row of an (m x d) matrix, with W W^T current whenever it is read.

    Rows written are only marked; reading `G` brings their Gram rows and columns up to date, all of them in one
    product: k rows written since the last read cost one (k x d) by (d x m) product (a round that hears from 10% of
    the clients updates 10% of it), and once at least half the rows changed (a pre-training round, written a window
    at a time) one symmetric W W^T instead of a product per window.
    """

    def __init__(
        self,
        num_clients: int,
        initial: np.ndarray,
        track_gram: bool = True,
        path: Path | None = None,
        start_at_initial: bool = True,
    ) -> None:
        """Rows start as `initial`, or as zeros when not `start_at_initial` (for a user of the rows that never reads
        a row before it was written: a 1,000-client store is 6.6 GB to fill at the MNIST CNN)."""
        initial = np.asarray(initial, dtype=np.float32).ravel()
        if num_clients < 1:
            raise ValueError(f"need at least one client, got {num_clients}")
        self.W = model_store(num_clients, initial if start_at_initial else None, path, initial.size)
        self.track_gram = track_gram
        norm2 = float(np.dot(initial.astype(np.float64), initial.astype(np.float64))) if start_at_initial else 0.0
        self._gram = np.full((num_clients, num_clients) if track_gram else (0, 0), norm2, dtype=np.float64)
        self._stale: set[int] = set()  # rows written since the Gram matrix was last brought up to date
        self.heard = np.zeros(num_clients, dtype=bool)  # rows replaced by an upload at least once
        self.device: str | None = None  # where the Gram rows' products run (products_on); None: the CPU

    @classmethod
    def from_state(
        cls, W: np.ndarray, G: np.ndarray, heard: np.ndarray, track_gram: bool, path: Path | None = None
    ) -> ModelMatrix:
        """A matrix restored from a checkpoint (rows, Gram matrix, which rows were ever uploaded); with `path` the
        rows are copied block by block into a new memory-mapped store there."""
        matrix = cls.__new__(cls)
        matrix.W = np.ascontiguousarray(W, dtype=np.float32) if path is None else copy_to_store(W, path)
        matrix._gram = np.ascontiguousarray(G, dtype=np.float64)
        matrix._stale = set()
        matrix.heard = np.asarray(heard, dtype=bool)
        matrix.track_gram = track_gram
        matrix.device = None
        m = matrix.W.shape[0]
        if matrix.heard.shape != (m,) or matrix._gram.shape != ((m, m) if track_gram else (0, 0)):
            raise ValueError(
                f"inconsistent model matrix state: W {matrix.W.shape}, G {matrix._gram.shape}, "
                f"heard {matrix.heard.shape}"
            )
        return matrix

    @property
    def num_clients(self) -> int:
        """Rows (clients) held."""
        return self.W.shape[0]

    def set_rows(self, rows: list[int], values: np.ndarray) -> None:
        """Replace the given rows by new models (k x d) and update the Gram matrix's rows and columns."""
        rows_arr = self._distinct(rows)
        values = np.asarray(values, dtype=np.float32).reshape(len(rows_arr), -1)
        if len(rows_arr):
            self.W[rows_arr] = values
        self._refresh(rows_arr)

    def set_rows_from_arrays(self, rows: list[int], models: Sequence[Sequence[np.ndarray]]) -> None:
        """set_rows with each new model given as its arrays (state-dict order), written straight into its row: no
        (k x d) stack of the uploads is made (a round of 100 MNIST CNNs would need 660 MB for it)."""
        rows_arr = self._distinct(rows)
        if len(models) != len(rows_arr):
            raise ValueError(f"{len(models)} models for {len(rows_arr)} rows")
        for row, arrays in zip(rows_arr, models):
            sizes = [np.size(a) for a in arrays]
            if sum(sizes) != self.W.shape[1]:
                raise ValueError(f"a model of {sum(sizes)} values for rows of {self.W.shape[1]}")
            ends = np.cumsum(sizes)
            for a, end, size in zip(arrays, ends, sizes):
                self.W[row, end - size : end] = np.ravel(a)
        self._refresh(rows_arr)

    @staticmethod
    def _distinct(rows: list[int]) -> np.ndarray:
        rows_arr = np.asarray(rows, dtype=np.int64)
        if len(np.unique(rows_arr)) != len(rows_arr):
            raise ValueError("each row may be set once per call")
        return rows_arr

    def _refresh(self, rows_arr: np.ndarray) -> None:
        """After rows were written: mark them heard, and their Gram rows stale (see `G`)."""
        release_pages(self.W)  # the rows just written (a store's data is kept in its file)
        if self.track_gram:
            self._stale.update(int(r) for r in rows_arr)
        self.heard[rows_arr] = True

    @property
    def G(self) -> np.ndarray:
        """W W^T (float64, (0 x 0) when the matrix does not track it), the rows written since the last read
        brought up to date first (in increasing row order: the result does not depend on how writes were split)."""
        if self._stale:
            rows_arr = np.asarray(sorted(self._stale), dtype=np.int64)
            with products_on(self.device):
                block = gram_rows(self.W, rows_arr)
            self._gram[rows_arr, :] = block
            self._gram[:, rows_arr] = block.T
            inner = self._gram[np.ix_(rows_arr, rows_arr)]
            self._gram[np.ix_(rows_arr, rows_arr)] = 0.5 * (inner + inner.T)  # exactly symmetric
            self._stale.clear()
        return self._gram


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


def fedamp_weights(
    W: np.ndarray, alpha_k: float, sigma: float, active: np.ndarray | None = None
) -> tuple[np.ndarray, bool]:
    """FedAMP xi from the model matrix (see fedamp_weights_from_gram)."""
    return fedamp_weights_from_gram(_gram(W), alpha_k, sigma, active)


def fedamp_weights_from_gram(
    G: np.ndarray, alpha_k: float, sigma: float, active: np.ndarray | None = None, tau: float | None = None
) -> tuple[np.ndarray, bool]:
    """FedAMP xi (Eq. 4/6 with A(t) = 1 - exp(-t/sigma)); True when some row needed the guard.

    xi_ij = alpha_k * exp(-||w_i - w_j||^2 / sigma) / sigma for j != i, xi_ii = 1 - sum_{j != i} xi_ij.
    A row whose off-diagonal sum exceeds 1 is rescaled to sum 1 with xi_ii = 0 (the paper's step
    would give client i a negative self weight). Inactive clients take no part: their row is the
    identity and no active row gives them weight.
    """
    if alpha_k < 0 or sigma <= 0:
        raise ValueError(f"need alpha_k >= 0 and sigma > 0, got alpha_k={alpha_k}, sigma={sigma}")
    D = _distances_from_gram(np.asarray(G, dtype=np.float64))
    peers = _peer_mask(_active_mask(active, D.shape[0]))
    if tau is not None:
        return _constant_self_attention(D, peers, sigma, tau), False
    xi = np.where(peers, alpha_k * np.exp(-D / sigma) / sigma, 0.0)
    off = xi.sum(axis=1)
    over = off > 1.0
    xi[over] /= off[over, None]
    np.fill_diagonal(xi, np.where(over, 0.0, 1.0 - off))
    return xi, bool(over.any())


def _constant_self_attention(D: np.ndarray, peers: np.ndarray, sigma: float, tau: float) -> np.ndarray:
    """FedAMP with a constant self-attention (its paper, App. C.1): xi_ii = 1 - tau, and the peers share tau in
    proportion to A'(D_ij) = exp(-D_ij / sigma) / sigma (computed shifted by the row's smallest distance, so far-apart
    models cannot underflow to 0 / 0). A client without peers keeps xi_ii = 1."""
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"need tau in [0, 1], got {tau}")
    nearest = np.where(peers, D, np.inf).min(axis=1, initial=np.inf)
    shifted = np.where(peers, D - np.where(np.isfinite(nearest), nearest, 0.0)[:, None], np.inf)  # >= 0 on peers
    share = np.exp(-shifted / sigma)  # exp(-inf) = 0 off the peers
    total = share.sum(axis=1)
    has_peers = total > 0
    xi = np.zeros_like(D)
    xi[has_peers] = tau * share[has_peers] / total[has_peers, None]
    np.fill_diagonal(xi, np.where(has_peers, 1.0 - tau, 1.0))
    return xi


def heurfedamp_weights(W: np.ndarray, sigma: float, tau: float, active: np.ndarray | None = None) -> np.ndarray:
    """HeurFedAMP xi from the model matrix (see heurfedamp_weights_from_gram)."""
    return heurfedamp_weights_from_gram(_gram(W), sigma, tau, active)


def heurfedamp_weights_from_gram(
    G: np.ndarray, sigma: float, tau: float, active: np.ndarray | None = None
) -> np.ndarray:
    """HeurFedAMP weights (Alg. 2, Eq. 10-11): 1 - tau on the diagonal, tau * softmax_j(sigma cos) off it.

    A client with no active peer (or an inactive one) keeps weight 1 on itself.
    """
    if sigma <= 0 or not 0.0 <= tau <= 1.0:
        raise ValueError(f"need sigma > 0 and 0 <= tau <= 1, got sigma={sigma}, tau={tau}")
    C = _cosine_from_gram(np.asarray(G, dtype=np.float64))
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
    """U = xi W (only `rows` of it when given), row i client i's cloud model u_i (see mix_rows)."""
    W = _check_models(W)
    xi = np.asarray(xi)
    if xi.shape != (W.shape[0], W.shape[0]):
        raise ValueError(f"xi has shape {xi.shape}, expected {(W.shape[0], W.shape[0])}")
    return mix_rows(xi if rows is None else xi[np.asarray(rows, dtype=np.int64)], W)


def mix_rows(weights: np.ndarray, W: np.ndarray, peers: Sequence[int] | None = None) -> np.ndarray:
    """weights @ W[peers] (all of W's rows when `peers` is None): float32 products of column blocks of those rows,
    on block_threads() threads (each block's columns of the result depend on that block alone), on the device
    `products_on` names."""
    W = _check_models(W)
    weights = np.asarray(weights, dtype=np.float32)  # float32: a float64 GEMM would copy every block
    width = W.shape[0] if peers is None else len(peers)
    if weights.ndim != 2 or weights.shape[1] != width:
        raise ValueError(f"weights have shape {weights.shape}, expected (k, {width})")
    out = np.empty((weights.shape[0], W.shape[1]), dtype=np.float32)
    device = _PRODUCTS_DEVICE
    weights_there = None if device is None else _on_device(weights, device)

    def fill(item: tuple[int, np.ndarray]) -> None:
        start, columns = item
        target = out[:, start : start + columns.shape[1]]
        if weights_there is not None and device is not None:
            target[...] = (weights_there @ _on_device(columns, device)).cpu().numpy()
        else:
            np.matmul(weights, columns, out=target)

    for _ in _over_column_blocks(W, 4, fill, None if peers is None else list(peers)):
        pass
    return out
