"""DM-PFL and DM-PFL+ server half (DM-PFL [KDD 2023] Alg. 1-3, Eq. 5): dual masks, phases laid out per cycle.

Paper: Zhang, Zhou, Wang, Tong, "DM-PFL: Hitchhiking Generic Federated Learning for Efficient Shift-Robust
Personalization", KDD 2023, doi:10.1145/3580305.3599311 (not on arXiv)."""

from __future__ import annotations

from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.supercore import log

from common.algorithms import DMPFLParams
from common.config import RunConfig
from common.learning.models import ModelLayout
from common.methods.dmpfl import (
    PARTIAL,
    PersonalMaskStore,
    aggregate_round,
    cycles_that_fit,
    encode_partial_global,
    masks_digest,
    phase3_starts,
    phase_schedule,
)
from common.methods.masks import cosine_decay, overlap_of_packed, packed_masks
from common.wire.messages import CONFIG, PERSONAL_MASK_DIGEST, PHASE, PHASE3_RESET, READJUST_RATIO
from common.wire.records import to_plain_record

from ..clients import ClientRegistry
from ..replies import TrainReply
from .sparse import SparseGlobalStrategy

PERSONAL_MASKS = "personal-masks.npy"  # in the run folder: the clients' m_c, packed and memory-mapped


class DMPFLStrategy(SparseGlobalStrategy):
    """Phase 1 trains dual masks (Eq. 5 + vote-filtered global mask), phase 2 refines w_g under m_g (masked
    FedAvg, values-only uploads), phase 3 refines every client's personal weights (no weight upload).

    Evaluation reports theta_c (DM-PFL) as the main accuracy, and DM-PFL+ and theta_g alongside (its spec's rows).

    Phases 1 and 3 use theta_g only where m_c meets m_g (Eq. 4), so a client whose m_c the server holds (packed,
    from its accepted phase-1 upload) is sent just w_g there (`partial-download`), with a digest of that m_c; like
    the whole model, a cut is sent once per (version, m_c).
    """

    def __init__(self, cfg: RunConfig, model: ModelLayout, clients: ClientRegistry) -> None:
        super().__init__(cfg, model, clients)
        self.params = cfg.params_as(DMPFLParams)
        self.phases = phase_schedule(cfg.num_rounds, self.params.iterations, self.params.phases)
        cycles = cycles_that_fit(cfg.num_rounds, self.params.iterations)
        if self.params.phases == "halves" and 0 < cycles < self.params.iterations:
            log(
                WARNING,
                "dmpfl: %d rounds hold %d cycle(s) of at least 3 rounds, not iterations=%d: running those",
                cfg.num_rounds,
                cycles,
                self.params.iterations,
            )
        self.resets = phase3_starts(self.phases) if self.params.phase3 == "all-reset" else set()
        self.phase1_rounds = [r for r, p in enumerate(self.phases, start=1) if p == 1]
        # the last phase-1 round: its clients and their masks, packed (their IoU is worked out once, at the end)
        self.overlap: tuple[int, list[int], list[np.ndarray]] | None = None
        self._personal_masks: PersonalMaskStore | None = None  # m_c of accepted phase-1 uploads (made on first use)
        self.delivered_partial: dict[int, tuple[int, int]] = {}  # (version, m_c digest) of the cut a client holds
        self._partial_in_flight: dict[int, tuple[int, int]] = {}

    def phase(self, server_round: int) -> int:
        """Phase of a round (1, 2 or 3)."""
        return self.phases[server_round - 1]

    def sample(self, server_round: int) -> list[int]:
        """Phases 1 and 2 sample as usual; phase 3 takes every client under `dmpfl-phase3` all / all-reset (Alg. 3:
        "for each client"), the round's sample otherwise.

        Sampling in phase 3 is what keeps DM-PFL's training FLOPs below FedAvg's with the three-phase layout; with
        every client in phase 3 each phase-3 round costs 1/fraction-train ordinary rounds.
        """
        if self.params.phase3 != "sampled" and self.phase(server_round) == 3:
            return self.clients.ids()
        return super().sample(server_round)

    def round_config(self, server_round: int, partition_id: int) -> ConfigRecord:
        """Adds the phase; in phase 1 the readjust ratio (cosine-decayed over the run's phase-1 rounds); in the
        first round of a phase-3 stretch under all-reset, the instruction to reset the personal-only weights."""
        config = super().round_config(server_round, partition_id)
        config[PHASE] = self.phase(server_round)
        if self.phase(server_round) == 1:
            step = self.phase1_rounds.index(server_round)
            config[READJUST_RATIO] = cosine_decay(self.params.readjust_ratio, step, len(self.phase1_rounds))
        if server_round in self.resets:
            config[PHASE3_RESET] = True
        return config

    @property
    def personal_masks(self) -> PersonalMaskStore:
        """Each client's m_c from its last accepted phase-1 upload: packed bits, memory-mapped in the run folder."""
        if self._personal_masks is None:
            path = self.workdir / PERSONAL_MASKS if self.workdir is not None else None
            self._personal_masks = PersonalMaskStore(
                self.clients.ids(), {n: self.shapes[n] for n in self.prunable}, path
            )
        return self._personal_masks

    def close(self) -> None:
        """Delete the memory-mapped mask store (the checkpoint holds its known rows)."""
        super().close()
        if self._personal_masks is not None:
            self._personal_masks.close()

    def state_dict(self) -> dict[str, Any]:
        """Adds the m_c the server knows and the cut each client holds, so that a resumed run sends the cuts an
        uninterrupted one would."""
        return {
            **super().state_dict(),
            "personal-masks": self.personal_masks.state(),
            "delivered-partial": {str(pid): list(cut) for pid, cut in self.delivered_partial.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores them, like the versions clients hold, only when clients keep their state on disk (else a client
        may not hold that m_c or cut); a checkpoint without them (older versions) sends whole models until the
        clients upload their masks again."""
        super().load_state_dict(state)
        if not self.cfg.client_state_on_disk:
            return
        if "personal-masks" in state:
            self.personal_masks.restore(state["personal-masks"])
        self.delivered_partial = {
            int(pid): (int(cut[0]), int(cut[1])) for pid, cut in state.get("delivered-partial", {}).items()
        }

    def train_content(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """In phases 1 and 3, w_g on m_g AND m_c alone (or nothing, if the client holds that cut) to a stale client
        whose m_c is known; else as any sparse algorithm."""
        use_partial = (
            self.params.partial_download
            and not self.cfg.stages
            and self.phase(server_round) != 2
            and not self.holds_current(partition_id)
        )
        m_c = self.personal_masks.get(partition_id) if use_partial else None
        if self.phase(server_round) == 1:  # the reply brings a new m_c; until it is accepted the old one is void
            self.personal_masks.forget(partition_id)
        if m_c is None:
            return super().train_content(server_round, partition_id, shared)
        cut = (self.version, masks_digest(m_c))
        config = self.round_config(server_round, partition_id)
        config[PERSONAL_MASK_DIGEST] = cut[1]
        content = RecordDict({CONFIG: config})
        if self.cfg.download == "always" or self.delivered_partial.get(partition_id) != cut:
            content[PARTIAL] = to_plain_record(encode_partial_global(self.global_named, self.global_masks, m_c))
            self._partial_in_flight[partition_id] = cut
        return content

    def on_client_reply(self, server_round: int, partition_id: int, ok: bool) -> None:
        """Confirms a partial download; a failed client may not hold the m_c the server knows (e.g. its phase-1
        reply was lost), so both are forgotten."""
        super().on_client_reply(server_round, partition_id, ok)
        sent = self._partial_in_flight.pop(partition_id, None)
        if not ok:
            self.personal_masks.forget(partition_id)
            self.delivered_partial.pop(partition_id, None)
        elif sent is not None:
            self.delivered_partial[partition_id] = sent

    def on_client_replaced(self, server_round: int, partition_id: int) -> None:
        """A restarted client holds neither the model nor, perhaps, its m_c."""
        super().on_client_replaced(server_round, partition_id)
        self.personal_masks.forget(partition_id)
        self.delivered_partial.pop(partition_id, None)

    def uploads_in_round(self, server_round: int) -> bool:
        """Phase 3 uploads no weights (the reply's own claim is not trusted: the round decides)."""
        return self.phase(server_round) != 3

    def vote_fraction(self) -> float:
        """Alg. 2's vote: a position stays eligible for m_g with more than `min-vote-fraction` of the uploads."""
        return self.params.min_vote_fraction

    def values_only_round(self, server_round: int) -> bool:
        """Phase 2 uploads the values on m_g; phase 1 weights with the client's mask."""
        return self.phase(server_round) == 2

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """Phase 1: Eq. 5 and the new m_g; phase 2: masked FedAvg; phase 3: nothing on the server."""
        phase = self.phase(server_round)
        self.count_private_uploads(replies if phase != 3 else [])
        if phase != 3:
            self.bound_uploads(replies)
        if phase == 1:
            uploads = [(r.payload[0], r.payload[1], r.weight) for r in replies]
            for reply in replies:
                self.personal_masks.put(reply.partition_id, reply.payload[1])
            if replies:  # a central-DP round may release noise alone
                self.overlap = (
                    server_round,
                    [r.partition_id for r in replies],
                    [packed_masks(r.payload[1]) for r in replies],
                )
            if self.cfg.dp == "central":  # m_g stays: the vote would release the clients' masks
                self.set_global(self.private_masked_average(replies))
                return
            weights, masks = aggregate_round(self.global_named, uploads, self.densities, self.params.min_vote_fraction)
            self.set_global(weights, masks)
            self.log_masks()
        elif phase == 2:
            private = self.cfg.dp == "central"
            self.set_global(self.private_masked_average(replies) if private else self.masked_average(replies))

    def artifacts(self) -> dict[str, np.ndarray]:
        """IoU of the masks the clients of the last phase-1 round uploaded (the report's mask-overlap heatmap)."""
        if self.overlap is None:
            return {}
        server_round, pids, packed = self.overlap
        return {
            "mask_overlap": overlap_of_packed(packed),
            "mask_overlap_clients": np.asarray(pids),
            "mask_overlap_round": np.asarray(server_round),
        }

    def round_record(self, server_round: int) -> dict[str, Any]:
        """Phase and global-mask density of the round."""
        kept = sum(int(m.sum()) for m in self.global_masks.values())
        total = sum(m.size for m in self.global_masks.values())
        return {"phase": self.phase(server_round), "global_mask_density": kept / total, "global_version": self.version}
