"""Base of strategies that keep every client's latest model on the server, one float32 row per client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from common.config import RunConfig
from common.learning.models import ModelLayout
from common.methods.attention import ModelMatrix
from common.storage.pages import row_blocks
from common.wire.records import flatten, to_record, unflatten

from ..clients import ClientRegistry
from ..replies import TrainReply
from .base import PFLStrategy, uploaded

MODEL_STORE = "client-models.npy"  # in the run folder: the clients' models, memory-mapped


def products_device(run_device: str) -> str | None:
    """Where the server's products over the clients' models run: this machine's GPU when it has one and the run's
    `device` is not cpu; else None, numpy on the CPU (a deployment's server may have no GPU where its clients do)."""
    if run_device == "cpu":
        return None
    import torch

    return "cuda" if torch.cuda.is_available() else None


class ClientModelsStrategy(PFLStrategy):
    """Rows of a ModelMatrix (all at the common initialization until a client uploads), indexed by partition; in a
    memory-mapped file of the run folder when the app gave one (`workdir`), so memory does not grow with clients."""

    track_gram: bool = True  # keep W W^T current (FedAMP's attention over every client needs it)
    rows_start_at_initial: bool = True  # False: a row is only read after its client uploaded (zeros until then)

    def __init__(self, cfg: RunConfig, model: ModelLayout, clients: ClientRegistry) -> None:
        super().__init__(cfg, model, clients)
        self.matrix: ModelMatrix | None = None
        self.products_device = products_device(cfg.device)
        self.rows: dict[int, int] = {}  # partition id -> row
        self.pids: list[int] = []  # row -> partition id

    def ensure_matrix(self) -> ModelMatrix:
        """The (clients x params) matrix, built on first use (after the handshake)."""
        if self.matrix is None:
            self.pids = self.clients.ids()
            self.rows = {pid: row for row, pid in enumerate(self.pids)}
            store = self.workdir / MODEL_STORE if self.workdir is not None else None
            self.matrix = ModelMatrix(
                len(self.pids), flatten(self.global_arrays), self.track_gram, store, self.rows_start_at_initial
            )
        self.matrix.device = self.products_device
        return self.matrix

    def close(self) -> None:
        """Delete the memory-mapped store (the checkpoint holds the rows a resumed run needs)."""
        if self.matrix is not None and isinstance(self.matrix.W, np.memmap):
            path = Path(str(self.matrix.W.filename))
            self.matrix = None
            path.unlink(missing_ok=True)

    def state_dict(self) -> dict[str, Any]:
        """The model rows (and Gram matrix), which rows were uploaded, and the row order."""
        state = super().state_dict()
        if self.matrix is not None:
            state["matrix"] = {
                "W": self.matrix.W,
                "G": self.matrix.G,
                "heard": self.matrix.heard,
                "pids": np.asarray(self.pids, dtype=np.int64),
            }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the rows; a client the checkpoint has no row for is refused (ValueError)."""
        super().load_state_dict(state)
        saved = state.get("matrix")
        if saved is None:
            return
        self.pids = [int(p) for p in saved["pids"]]
        self.rows = {pid: row for row, pid in enumerate(self.pids)}
        store = self.workdir / MODEL_STORE if self.workdir is not None else None
        self.matrix = ModelMatrix.from_state(saved["W"], saved["G"], saved["heard"], self.track_gram, store)
        check_matrix(self.matrix, flatten(self.global_arrays).size)
        unknown = sorted(set(self.clients.ids()) - set(self.rows))
        if unknown:
            raise ValueError(f"partitions {unknown[:5]} are not in the checkpoint's client models")

    def model_record(self, vector: np.ndarray) -> ArrayRecord:
        """One flat model vector as an ArrayRecord named like the model's state dict."""
        arrays = unflatten(vector, [shape for _, shape in self.specs])
        return to_record([name for name, _ in self.specs], arrays)

    def newcomer_record(self) -> ArrayRecord:
        """A newcomer gets the mean of the models heard from (the common initialization before any upload)."""
        matrix = self.ensure_matrix()
        heard = np.flatnonzero(matrix.heard)
        if len(heard) == 0:
            return self.global_record()
        total = np.zeros(matrix.W.shape[1], dtype=np.float64)
        for block in row_blocks(matrix.W, heard):  # no copy of all the heard rows at once
            total += block.sum(axis=0, dtype=np.float64)
        return self.model_record((total / len(heard)).astype(np.float32))

    def store_replies(self, replies: list[TrainReply]) -> None:
        """Each reply's model becomes its client's row (one Gram update for all of them)."""
        matrix = self.ensure_matrix()
        known = [r for r in replies if r.partition_id in self.rows]
        if known:
            matrix.set_rows_from_arrays([self.rows[r.partition_id] for r in known], [uploaded(r) for r in known])


def check_matrix(matrix: ModelMatrix, width: int) -> None:
    """A restored model matrix must fit the model, hold finite rows, and its Gram matrix must be the rows' (symmetric,
    diagonal = squared row norms): ValueError otherwise. Cost: one pass over the rows."""
    if matrix.W.ndim != 2 or matrix.W.shape[1] != width:
        raise ValueError(f"checkpoint's client models have shape {matrix.W.shape}, the model has {width} parameters")
    block_norms = []
    for block in row_blocks(matrix.W):  # block by block: a whole-store isfinite would need a bool per value
        if not np.all(np.isfinite(block)):
            raise ValueError("checkpoint's client models have NaN or Inf values")
        block_norms.append(np.einsum("ij,ij->i", block, block, dtype=np.float64))
    if matrix.track_gram:
        norms = np.concatenate(block_norms)
        if not (
            np.all(np.isfinite(matrix.G))
            and np.allclose(matrix.G, matrix.G.T)
            and np.allclose(np.diag(matrix.G), norms, rtol=1e-4, atol=1e-6)
        ):
            raise ValueError("checkpoint's Gram matrix is not that of its client models")
