"""Shared server half of sparse algorithms: an ERK-masked global model sent as a sparse payload, only when stale."""

from __future__ import annotations

import math
from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, RecordDict
from flwr.supercore import log

from common.algorithms import SparseParams
from common.config import RunConfig
from common.learning.models import ModelLayout
from common.methods.aggregate import weighted_sum
from common.methods.dmpfl import select_global_mask
from common.methods.masked_ops import scatter, select
from common.methods.masks import erk_densities, random_masks
from common.methods.robust import scale_updates, update_norms
from common.secagg.encoding import Decoded
from common.secagg.wire import units_of, votes_of
from common.seeding import derive_seed
from common.wire.codec import decode_model, encode_model
from common.wire.messages import ARRAYS, CONFIG, GLOBAL_MODEL, GLOBAL_VERSION
from common.wire.records import to_plain_record
from common.wire.validation import PayloadError, record_to_numpy

from ..clients import ClientRegistry
from ..replies import TrainReply
from .base import PFLStrategy

Named = dict[str, np.ndarray]


class SparseGlobalStrategy(PFLStrategy):
    """Holds w_g (dense values, kept everywhere) and m_g (bool masks of the prunable layers).

    A client is sent w_g * m_g (packed bitmask + values; dense layers dense) only when its copy is older
    than the current `version` (or always, under `download` always); otherwise the message carries just the
    version, and a client whose copy does not match fails the round and is sent the model next time.
    """

    def __init__(self, cfg: RunConfig, model: ModelLayout, clients: ClientRegistry) -> None:
        super().__init__(cfg, model, clients)
        if not self.prunable:
            raise ValueError(f"{cfg.algorithm} needs a model with prunable (conv/linear) layers")
        self.shapes = dict(self.specs)
        sparsity = cfg.params_as(SparseParams).sparsity
        self.densities = erk_densities({n: self.shapes[n] for n in self.prunable}, 1.0 - sparsity)
        generator = torch.Generator().manual_seed(derive_seed(cfg.seed, "global-mask"))
        masks = random_masks({n: self.shapes[n] for n in self.prunable}, self.densities, generator)
        self.global_masks = {n: m.numpy() for n, m in masks.items()}
        self.version = 0
        self.delivered: dict[int, int] = {}
        self._in_flight: dict[int, int] = {}

    # ----- state as named dicts ----------------------------------------------------------------------
    @property
    def global_named(self) -> dict[str, np.ndarray]:
        """w_g by parameter name."""
        return {name: a for (name, _), a in zip(self.specs, self.global_arrays)}

    def set_global(self, named: dict[str, np.ndarray], masks: dict[str, np.ndarray] | None = None) -> None:
        """Replace w_g (and m_g) and start a new version."""
        self.global_arrays = [named[name] for name, _ in self.specs]
        if masks is not None:
            self.global_masks = masks
        self.version += 1

    def state_dict(self) -> dict[str, Any]:
        """w_g, m_g, the version, and which version each client holds."""
        return {
            **super().state_dict(),
            "masks": dict(self.global_masks),
            "version": self.version,
            "delivered": {str(pid): v for pid, v in self.delivered.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore w_g, m_g and the version. What clients hold is kept only when they keep their state on disk
        in this simulation (client-state-dir); otherwise every client is sent the model again."""
        super().load_state_dict(state)
        masks = {name: np.asarray(m, dtype=bool) for name, m in state["masks"].items()}
        if set(masks) != set(self.prunable) or any(masks[n].shape != self.shapes[n] for n in masks):
            raise ValueError("checkpoint's global masks do not match the configured model")
        self.global_masks = masks
        self.version = int(state["version"])
        self.delivered = (
            {int(pid): int(v) for pid, v in state["delivered"].items()} if self.cfg.client_state_on_disk else {}
        )

    def on_client_replaced(self, server_round: int, partition_id: int) -> None:
        """A restarted client may hold an older copy: send it the model again."""
        self.delivered.pop(partition_id, None)

    # ----- messages ------------------------------------------------------------------------------------
    def shared_payload(self, server_round: int) -> dict[str, Any]:
        """The sparse global model, encoded once per round."""
        return {"global": to_plain_record(encode_model(self.global_named, self.global_masks))}

    def round_config(self, server_round: int, partition_id: int) -> ConfigRecord:
        """Adds the global version the client must hold."""
        config = super().round_config(server_round, partition_id)
        config[GLOBAL_VERSION] = self.version
        return config

    def holds_current(self, partition_id: int) -> bool:
        """Whether the client holds the current global model and may be spared it (`download` stale); under
        `download` always every message carries what the client uses, as dense algorithms' do."""
        return self.cfg.download == "stale" and self.delivered.get(partition_id) == self.version

    def _with_global(self, content: RecordDict, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        if not self.holds_current(partition_id):
            content[GLOBAL_MODEL] = shared["global"]
            self._in_flight[partition_id] = self.version
        return content

    def train_content(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """Instructions, plus the sparse global model if the client's copy is stale."""
        return self._with_global(
            RecordDict({CONFIG: self.round_config(server_round, partition_id)}), partition_id, shared
        )

    def eval_content(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """Evaluation needs the whole current global model (sent only if stale)."""
        return self._with_global(
            RecordDict({CONFIG: self.round_config(server_round, partition_id)}), partition_id, shared
        )

    def on_client_reply(self, server_round: int, partition_id: int, ok: bool) -> None:
        """A successful reply confirms the version in flight; a failure forgets what the client holds."""
        sent = self._in_flight.pop(partition_id, None)
        if not ok:
            self.delivered.pop(partition_id, None)
        elif sent is not None:
            self.delivered[partition_id] = sent

    # ----- replies ---------------------------------------------------------------------------------------
    def decode_upload(self, content: RecordDict, values_only: bool) -> tuple[Named, Named]:
        """Validated (weights, masks) of a sparse upload: every prunable layer sparse, kept as its 1-D values on its
        mask (the aggregations take them so), the rest dense."""
        arrays = record_to_numpy(content.array_records.get(ARRAYS))
        carried = sorted(key.rsplit("/", 1)[0] for key in arrays if key.endswith("/bits"))
        if values_only and carried:  # e.g. a phase-1 upload replayed in phase 2: it would average zeros into m_g
            raise PayloadError(
                f"this round takes values on the global mask only, but the upload carries its own mask "
                f"for {carried[:3]}"
            )
        known = self.global_masks if values_only else None
        try:
            weights, masks = decode_model(arrays, self.shapes, known_masks=known, sparse_as_values=True)
        except ValueError as exc:
            raise PayloadError(str(exc)) from None
        if set(masks) != set(self.prunable):
            raise PayloadError(f"sparse layers {sorted(masks)} differ from the model's {self.prunable}")
        for name, mask in masks.items():
            allowed = round(self.densities[name] * mask.size)
            if weights[name].size > allowed:  # one value per set mask position (decode_model checked)
                raise PayloadError(
                    f"mask of '{name}' keeps {weights[name].size} weights, more than the {allowed} its density allows"
                )
        return weights, masks

    def decode_train_reply(self, server_round: int, reply: TrainReply) -> None:
        """The round's sparse upload: values on m_g only when `values_only_round` says so, else masks too."""
        if self.uploads_in_round(server_round):
            reply.payload = self.decode_upload(reply.content, values_only=self.values_only_round(server_round))

    def values_only_round(self, server_round: int) -> bool:
        """Whether this round's uploads are values on the known m_g (subclasses decide)."""
        return False

    def bound_uploads(self, replies: list[TrainReply]) -> None:
        """Run-config `max-update-ratio` on sparse uploads, in place: each reply's update is its values minus the
        global model's at the same positions (its mask's on prunable layers, whole dense layers), shortened as in
        every weighted average (PFLStrategy.peer_factors)."""
        if self.cfg.max_update_ratio <= 0 or not replies:
            return
        uploads = [(list(values), list(values.values()), masks) for values, masks in (r.payload for r in replies)]
        references = [
            [self.global_named[name][masks[name]] if name in masks else self.global_named[name] for name in names]
            for names, _, masks in uploads
        ]
        norms = np.array([update_norms([u], ref)[0] for (_, u, _), ref in zip(uploads, references, strict=True)])
        for reply, (names, upload, masks), ref, scale in zip(
            replies, uploads, references, self.peer_factors(norms), strict=True
        ):
            if scale < 1.0:
                (shortened,) = scale_updates([upload], ref, [scale])
                reply.payload = (dict(zip(names, shortened, strict=True)), masks)

    def masked_average(self, replies: list[TrainReply]) -> dict[str, np.ndarray]:
        """Sample-weighted average of values-only uploads on m_g (prunable layers: the values, all on m_g's
        positions, averaged as they are, then put in place) and everywhere on dense layers."""
        total = float(sum(r.weight for r in replies))
        out = {}
        for name, old in self.global_named.items():
            mean = weighted_sum([r.payload[0][name] for r in replies], [r.weight for r in replies]) / total
            if name in self.global_masks:
                mask = self.global_masks[name]
                out[name] = select(mask, scatter(mean, mask), old)
            else:
                out[name] = mean.astype(np.float32)
        return out

    def count_private_uploads(self, replies: list[TrainReply]) -> None:
        """Under `dp` = local, count each client's noised uploads for the epsilon the round reports."""
        if self.cfg.dp == "local" and replies:
            self.aggregation_fields = {"dp": self.count_local_dp(replies)}

    def private_masked_average(self, replies: list[TrainReply]) -> dict[str, np.ndarray]:
        """Central DP's round (run-config `dp` = central) on m_g, which stays as it is: each client's update is
        clipped on the positions it sent that lie in m_g (and on the dense layers), noise goes on m_g's positions
        only, so w_g stays as sparse as without DP. Positions a client kept outside m_g are dropped: only m_g is
        released, and a vote on the clients' masks would release more than the accountant counts."""
        reference = [np.asarray(a, np.float32) for a in self.global_arrays]
        shared = [self.global_masks.get(name) for name, _ in self.specs]
        models: list[list[np.ndarray]] = []
        supports: list[list[np.ndarray | None]] = []
        for reply in replies:
            weights, masks = reply.payload
            model: list[np.ndarray] = []
            support: list[np.ndarray | None] = []
            for (name, _), old, global_mask in zip(self.specs, reference, shared, strict=True):
                if global_mask is None:
                    model.append(np.asarray(weights[name], np.float32))
                    support.append(None)
                    continue
                sent = masks[name] & global_mask
                model.append(np.where(sent, scatter(weights[name], masks[name]), old))
                support.append(sent)
            models.append(model)
            supports.append(support)
        averaged = self.private_mean(models, reference, supports, shared)
        return {name: a for (name, _), a in zip(self.specs, averaged, strict=True)}

    def vote_fraction(self) -> float:
        """The share of a round's uploads a position's votes must exceed to stay eligible for m_g."""
        return 0.0

    def secure_layout(self, server_round: int) -> tuple[list[tuple[str, int]], list[str]]:
        """Under `secagg`: values-only rounds carry each prunable layer's values on m_g (its size known to both
        sides); the other rounds carry them dense on the client's own mask, with per-position weights and votes."""
        values_only = self.values_only_round(server_round)
        sections = []
        for name, shape in self.specs:
            mask = self.global_masks.get(name)
            sections.append((name, int(mask.sum()) if values_only and mask is not None else math.prod(shape)))
        return sections, ([] if values_only else list(self.prunable))

    def aggregate_secure(self, server_round: int, decoded: Decoded, survivors: int, loss: float) -> None:
        """Under `secagg`, from the cohort's sum: a values-only round's weighted mean on m_g (masked_average's); a
        mask round's Eq. 5 from the summed per-position weights and the new m_g from the summed votes
        (aggregate_round's, the vote over the `survivors` uploads)."""
        old, values_only = self.global_named, self.values_only_round(server_round)
        weights: dict[str, np.ndarray] = {}
        masks: dict[str, np.ndarray] = {}
        for name, shape in self.specs:
            mask = self.global_masks.get(name)
            if mask is None:
                weights[name] = decoded.mean(name).reshape(shape).astype(np.float32)
            elif values_only:
                weights[name] = select(mask, scatter(decoded.mean(name).astype(np.float32), mask), old[name])
            else:
                mean = decoded.masked_mean(name, units_of(name), old[name]).reshape(shape).astype(np.float32)
                votes = decoded.integers[votes_of(name)].reshape(shape)
                weights[name] = mean
                masks[name] = select_global_mask(mean, votes, survivors, self.densities[name], self.vote_fraction())
        self.set_global(weights, masks or None)
        if masks:
            self.log_masks()

    def log_masks(self) -> None:
        """Density of m_g after a change."""
        kept = sum(int(m.sum()) for m in self.global_masks.values())
        total = sum(m.size for m in self.global_masks.values())
        log(INFO, "%s: global mask density %.3f (version %d)", self.cfg.algorithm, kept / total, self.version)
