"""Shared client half of sparse algorithms: keep the server's sparse global model, encode sparse uploads."""

from __future__ import annotations

import math

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict

from common.learning.models import SplitModel, get_arrays
from common.learning.train import MeanGradient
from common.methods.dmpfl import Named, compose_global
from common.wire.codec import decode_model, encode_model
from common.wire.messages import GLOBAL_MODEL, GLOBAL_VERSION
from common.wire.payload_memo import PayloadMemo
from common.wire.records import to_plain_record
from common.wire.validation import PayloadError, read_count, record_to_numpy

from ..privacy import private_weights
from .base import ClientAlgorithm, ClientEnv

GLOBAL = "global/model"  # client state: the global model of the version held, as the codec sends it
GLOBAL_VERSION_KEY = "global/version"  # client state: that model's version
# the global model a round sends: decoded once per worker process, not once per client (common/wire/payload_memo.py)
_RECEIVED: PayloadMemo[tuple[Named, Named, Named]] = PayloadMemo()


class StaleGlobalModel(RuntimeError):
    """The client's copy of the global model is not the version the server expects (it resends next time)."""


class SparseGlobalClient(ClientAlgorithm):
    """Holds the latest global model (w_g * m_g) and its version in client state."""

    def __init__(self, env: ClientEnv) -> None:
        super().__init__(env)
        layout = self.layout()
        self.shapes = dict(layout.specs)
        self.names = [name for name, _ in layout.specs]
        self.prunable = list(layout.prunable)

    def refresh_global(self, content: RecordDict) -> tuple[Named, Named]:
        """(w_g, m_g): from the message when sent (validated, then stored), else the stored copy of this version."""
        version = read_count(self.instructions(content), GLOBAL_VERSION, allow_zero=True)
        state = self.env.state
        if GLOBAL_MODEL in content.array_records:
            record = content.array_records[GLOBAL_MODEL]
            params = (tuple(self.shapes.items()), tuple(self.prunable))
            arrays, weights, masks = _RECEIVED.get(record, params, lambda: self._decode_global(record))
            # what save_sparse would store, validated: encode_model(weights, masks) gives these arrays again
            state.save_named(GLOBAL, arrays)
            state.save_named(GLOBAL_VERSION_KEY, {"version": np.array([version], np.int64)})
            return dict(weights), dict(masks)
        stored = self.held_global(version)
        if stored is None:
            held = state.load_named(GLOBAL_VERSION_KEY)
            have = int(held["version"][0]) if held else None
            if have != version:
                raise StaleGlobalModel(f"client holds global version {have}, the server expects {version}")
            raise StaleGlobalModel(f"client state lacks the global model of version {version}")
        return stored

    def held_global(self, version: int) -> tuple[Named, Named] | None:
        """(w_g, m_g) of the global model kept in client state, if it is of `version`."""
        held = self.env.state.load_named(GLOBAL_VERSION_KEY)
        if held is None or int(held["version"][0]) != version:
            return None
        return self.load_sparse(GLOBAL)

    def _decode_global(self, record: ArrayRecord) -> tuple[Named, Named, Named]:
        """The global model's arrays as sent, and its weights and masks, validated; read-only (the results are
        shared by every client this process serves with the same payload)."""
        arrays = record_to_numpy(record)
        weights, masks = decode_model(arrays, self.shapes)
        if set(masks) != set(self.prunable):
            raise PayloadError(f"global model has sparse layers {sorted(masks)}, expected {self.prunable}")
        for value in (*weights.values(), *masks.values()):
            value.setflags(write=False)
        return arrays, weights, masks

    def save_sparse(self, key: str, weights: Named, masks: Named) -> None:
        """Keep a model in client state as the codec sends it: its masked layers as bits + the values on the mask
        (about half the bytes of dense weights and bool masks), the others dense; weights off the mask are not kept."""
        self.env.state.save_named(key, encode_model(weights, masks))

    def load_sparse(self, key: str, shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[Named, Named] | None:
        """(weights with zeros off the mask, masks) kept by save_sparse, or None."""
        stored = self.env.state.load_named(key)
        return None if stored is None else decode_model(stored, shapes or self.shapes)

    def theta_g(self, w_g: Named, m_g: Named) -> Named:
        """w_g * m_g on the masked layers, w_g elsewhere."""
        return {n: compose_global(w_g[n], m_g[n]) if n in m_g else w_g[n] for n in self.names}

    def to_model(self, named: Named) -> SplitModel:
        """A model holding these weights."""
        return self.new_model([named[name] for name in self.names])

    def named(self, model: torch.nn.Module) -> Named:
        """A model's weights by name."""
        return dict(zip(self.names, get_arrays(model)))

    @staticmethod
    def torch_masks(masks: Named) -> dict[str, torch.Tensor]:
        """Masks as bool tensors (the training loop's update masks; copies: a received mask is read-only)."""
        return {name: torch.from_numpy(np.array(m, dtype=bool)) for name, m in masks.items()}

    @staticmethod
    def densities(masks: Named) -> dict[str, float]:
        """Fraction of active weights per masked layer (for FLOP counting)."""
        return {name: float(m.mean()) for name, m in masks.items()}

    def gradient_collector(self) -> MeanGradient:
        """Mean gradient of the prunable layers over the last local epoch's batches."""
        batches = math.ceil(self.env.data.num_train / self.cfg.batch_size)
        return MeanGradient(self.prunable, start_step=max(self.cfg.local_epochs - 1, 0) * batches)

    def upload(
        self, weights: Named, masks: Named, values_only: bool, received: tuple[Named, Named], server_round: int
    ) -> ArrayRecord:
        """Sparse upload: masked layers as bitmask + values (or values only), the rest dense. Under `dp` = local
        the update against theta_g of the `received` (w_g, m_g) is clipped and noised on what travels first: the
        mask's positions and the dense layers, so the upload stays as sparse as without DP (theta_g is composed
        only then)."""
        if self.cfg.privacy.dp == "local":
            supports = {name: masks.get(name) for name in self.names}
            reference = self.theta_g(*received)
            weights = private_weights(
                self.cfg.privacy, reference, weights, supports, self.env.partition_id, server_round
            )
        return to_plain_record(encode_model(weights, masks, values_only=values_only))

    def private_reply(self, server_round: int, content: RecordDict, reply: RecordDict) -> RecordDict:
        """The reply as `upload` made it: under `dp` = local it clipped and noised the update on its support."""
        return reply
