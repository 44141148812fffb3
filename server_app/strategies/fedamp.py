"""FedAMP and HeurFedAMP server half (the FedAMP paper's Alg. 1-2): attentive personalized cloud models, one per client.

Paper: Huang et al., "Personalized Federated Learning: An Attentive Collaboration Approach" (FedAMP),
arXiv:2007.03797."""

from __future__ import annotations

from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.supercore import log

from common.algorithms import AMPParams, FedAMPParams, HeurFedAMPParams
from common.config import RunConfig
from common.data.noise import seeded_client_ids
from common.learning.models import ModelLayout
from common.methods.attention import (
    fedamp_weights_from_gram,
    gram_among,
    heurfedamp_weights_from_gram,
    mix_rows,
    products_on,
)
from common.methods.robust import scale_updates, update_norms, walk_direction, walk_seed
from common.seeding import derive_seed
from common.wire.messages import ARRAYS, CONFIG, PRETRAIN, PROX_MU
from common.wire.records import unflatten

from ..clients import ClientRegistry
from ..replies import TrainReply
from .base import uploaded
from .client_models import ClientModelsStrategy


class FedAMPStrategy(ClientModelsStrategy):
    """Keeps every client's latest model as a row of one float32 matrix; sends client i its own
    u_i = sum_j xi_ij w_j with FedAMP's exp-distance attention; clients train toward u_i with a proximal term.

    Round 0 (when `pretrain-epochs` > 0): every client trains from the common initialization; that becomes its
    row. Clients not heard from in a round (not sampled, dropped, rejected) are used with their stored, stale rows.
    Variants: `pretrain-when` first-sampled (a client pre-trains the first round it is sampled instead of in round 0;
    until it has uploaded, its row takes no part in the attention) and `fedamp-attend` round (the attention of a
    round is over its participants only). The Gram rows and cloud models are made on the server's GPU when it has
    one (client_models.products_device).
    """

    sends_weights_for_eval = False

    def __init__(self, cfg: RunConfig, model: ModelLayout, clients: ClientRegistry) -> None:
        super().__init__(cfg, model, clients)
        self.amp = cfg.params_as(AMPParams)
        self.per_round = self.amp.fedamp_attend == "round"
        self.track_gram = not self.per_round  # over the round's participants, their Gram matrix is made per round
        self.lazy = self.amp.pretrain_when == "first-sampled" and self.amp.pretrain_epochs > 0
        self.rows_start_at_initial = not self.lazy  # a row never uploaded takes no part: no need to fill it
        self._guard = False
        self._self_weight: float | None = None
        self._stored = (0, 0, 0)  # (round, rows it updated, of which first uploads)
        self._last_xi: tuple[np.ndarray, list[int]] | None = None  # the last attention and its rows' partitions
        self._walk: dict[str, Any] = {}

    # ----- attention -------------------------------------------------------------------------------
    def alpha_k(self, server_round: int) -> float:
        """alpha_k: the initial alpha times `fedamp-decay` every `fedamp-decay-every` rounds."""
        return self.amp.fedamp_alpha * self.amp.fedamp_decay ** ((server_round - 1) // self.amp.fedamp_decay_every)

    def attention(self, server_round: int, peers: list[int] | None = None) -> np.ndarray:
        """xi over the given rows (all when None): from the Gram matrix of every row kept current, or made from the
        peers' rows alone. Under `pretrain-when` first-sampled, rows never uploaded take no part."""
        matrix = self.ensure_matrix()
        if peers is None:
            gram, rows = matrix.G, list(range(matrix.num_clients))
        else:
            gram, rows = gram_among(matrix.W, peers), peers
        xi = self.weights_from_gram(gram, server_round, matrix.heard[rows] if self.lazy else None)
        self._last_xi = (xi, [self.pids[r] for r in rows])
        return xi

    def weights_from_gram(self, gram: np.ndarray, server_round: int, active: np.ndarray | None) -> np.ndarray:
        """FedAMP's exp-distance attention (with the guard, logged) over the rows of `gram`."""
        params = self.cfg.params_as(FedAMPParams)
        tau = params.fedamp_tau if params.fedamp_tau >= 0 else None
        xi, self._guard = fedamp_weights_from_gram(gram, self.alpha_k(server_round), params.fedamp_sigma, active, tau)
        if self._guard:
            log(
                WARNING,
                "round %d: some clients' off-diagonal attention summed above 1; rescaled to 1 "
                "(lower fedamp-alpha or raise fedamp-sigma to avoid it)",
                server_round,
            )
        return xi

    def cloud_for(
        self, server_round: int, participants: list[int], targets: list[int], note: bool = True
    ) -> dict[int, np.ndarray]:
        """u_i of the `targets` (partition ids) with attention over every row, or over the `participants'` rows
        (`fedamp-attend` round); `note`: the median self-weight goes in the round's record."""
        if not targets:
            return {}
        matrix = self.ensure_matrix()
        with products_on(self.products_device):  # the Gram rows and the mixes below, on the server's GPU if any
            if not self.per_round:
                xi = self.attention(server_round)
                picked = [self.rows[pid] for pid in targets]
                mixed = mix_rows(xi[picked], matrix.W)
            else:
                peers = [self.rows[pid] for pid in participants]
                xi = self.attention(server_round, peers)
                position = {pid: at for at, pid in enumerate(participants)}
                picked = [position[pid] for pid in targets]
                mixed = mix_rows(xi[picked], matrix.W, peers)
        # how much of u_i is w_i itself: ~1 means local training, ~1/m uniform averaging (tune sigma by it)
        if note:
            self._self_weight = float(np.median(xi[picked, picked]))
            if self.cfg.attack_walk > 0:
                self.note_walk(targets, mixed)
        return dict(zip(targets, mixed))

    def note_walk(self, targets: list[int], mixed: np.ndarray) -> None:
        """Simulation under `attack-walk`: how far along the walkers' direction the honest clients' u_i of the round
        lie (median), and the walkers' stored rows (mean): the round record's `walk`."""
        matrix = self.ensure_matrix()
        direction = walk_direction(matrix.W.shape[1], walk_seed(self.cfg.seed)).astype(np.float32)
        partitions = len(self.clients.ids()) + len(self.clients.holdout_ids())  # as the clients draw them
        walkers = seeded_client_ids(partitions, self.cfg.attack_clients, derive_seed(self.cfg.seed, "attackers"))
        honest = [float(u @ direction) for pid, u in zip(targets, mixed, strict=True) if pid not in walkers]
        rows = [float(np.asarray(matrix.W[self.rows[pid]]) @ direction) for pid in sorted(walkers) if pid in self.rows]
        self._walk = {
            "honest_cloud": float(np.median(honest)) if honest else None,
            "walkers_row": float(np.mean(rows)) if rows else None,
        }

    def artifacts(self) -> dict[str, np.ndarray]:
        """The last attention matrix xi and its rows' partition ids (the report's heatmap)."""
        if self._last_xi is None:
            return {}
        return {"attention": self._last_xi[0], "attention_clients": np.asarray(self._last_xi[1])}

    # ----- messages --------------------------------------------------------------------------------
    def warmup_round(self) -> bool:
        """Round 0 is the clients' local pre-training (`pretrain-epochs` > 0, `pretrain-when` round-0)."""
        return self.amp.pretrain_epochs > 0 and not self.lazy

    def pretrains(self, server_round: int, partition_id: int) -> bool:
        """Whether this client's training message of the round is its pre-training."""
        return server_round == 0 or (self.lazy and not self.ensure_matrix().heard[self.rows[partition_id]])

    def round_config(self, server_round: int, partition_id: int) -> ConfigRecord:
        """Adds the proximal coefficient lambda / alpha_k (or, in round 0, the pre-training flag)."""
        config = super().round_config(server_round, partition_id)
        if server_round == 0:
            config[PRETRAIN] = True
        else:
            config[PROX_MU] = self.amp.fedamp_lambda / self.alpha_k(server_round)
        return config

    def shared_payload(self, server_round: int) -> dict[str, Any]:
        """The common initialization in round 0; cloud models are per client (see train_content)."""
        return {"global": self.global_record()} if server_round == 0 else {}

    def train_content(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """u_i for this client (all the round's u_i come from one xi and one GEMM), or the common initialization to
        pre-train from."""
        if self.pretrains(server_round, partition_id):
            if "global" not in shared:
                shared["global"] = self.global_record()
            config = super().round_config(server_round, partition_id)
            config[PRETRAIN] = True
            return RecordDict({ARRAYS: shared["global"], CONFIG: config})
        config = self.round_config(server_round, partition_id)
        if "cloud" not in shared:
            participants = self.participants(server_round, partition_id)
            targets = [pid for pid in participants if not self.pretrains(server_round, pid)]
            shared["cloud"] = self.cloud_for(server_round, self.attended(participants), targets)
        u = shared["cloud"].get(partition_id)
        if u is None:  # a client outside the round's sample (its u_i alone)
            participants = self.participants(server_round, partition_id)
            u = self.cloud_for(server_round, self.attended(participants), [partition_id], note=False)[partition_id]
        return RecordDict({ARRAYS: self.model_record(u), CONFIG: config})

    def participants(self, server_round: int, partition_id: int) -> list[int]:
        """The round's sampled clients and this one, sorted."""
        return sorted(set(self.sample(server_round)) | {partition_id})

    def attended(self, participants: list[int]) -> list[int]:
        """The participants whose models take part in the round's attention under `fedamp-attend` round (those
        who uploaded at least once, under `pretrain-when` first-sampled)."""
        heard = self.ensure_matrix().heard
        return [pid for pid in participants if not self.lazy or heard[self.rows[pid]]]

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """Store each reply as its client's new row (and the Gram matrix's row/column), bounded first."""
        heard = self.ensure_matrix().heard
        first = sum(1 for r in replies if r.partition_id in self.rows and not heard[self.rows[r.partition_id]])
        self.bound_to_rows([r for r in replies if r.partition_id in self.rows])
        self.store_replies(replies)
        self._stored = (server_round, len(replies), first)

    def bound_to_rows(self, replies: list[TrainReply]) -> None:
        """Run-config `max-update-ratio`, in place: each upload's update, measured from its client's stored row (its
        previous upload; the common initialization before the first: the server keeps no copy of the u_i it sent),
        at most that many times the median of the round's other updates (PFLStrategy.peer_factors). Without it, one
        device's upload c * w enters every u_i: HeurFedAMP's cosine attention does not see the scale c."""
        if self.cfg.max_update_ratio <= 0 or not replies:
            return
        matrix = self.ensure_matrix()
        shapes = [shape for _, shape in self.specs]
        initial = self.global_arrays  # the common initialization: the reference of a row never uploaded
        references = [
            unflatten(np.array(matrix.W[self.rows[r.partition_id]]), shapes)
            if matrix.heard[self.rows[r.partition_id]]
            else initial
            for r in replies
        ]
        norms = np.array([update_norms([uploaded(r)], ref)[0] for r, ref in zip(replies, references, strict=True)])
        for reply, ref, scale in zip(replies, references, self.peer_factors(norms), strict=True):
            if scale < 1.0:
                (reply.arrays,) = scale_updates([uploaded(reply)], ref, [scale])

    def round_record(self, server_round: int) -> dict[str, Any]:
        """alpha_k, whether the guard fired, and how many rows are stale or never updated (and, under
        `pretrain-when` first-sampled, how many clients pre-trained this round)."""
        matrix = self.ensure_matrix()
        updated, first = self._stored[1:] if self._stored[0] == server_round else (0, 0)
        record: dict[str, Any] = {
            "alpha_k": self.alpha_k(server_round),
            "guard": self._guard,
            "self_weight_median": self._self_weight,
            "stale_rows": matrix.num_clients - updated,
            "never_heard": int((~matrix.heard).sum()),
        }
        if self._walk:
            record["walk"] = self._walk
        return {**record, "pretrained": first} if self.lazy else record


class HeurFedAMPStrategy(FedAMPStrategy):
    """HeurFedAMP (Alg. 2): u_i = (1 - tau) w_i + tau * sum_{j != i} softmax_j(sigma cos(w_i, w_j)) w_j."""

    def weights_from_gram(self, gram: np.ndarray, server_round: int, active: np.ndarray | None) -> np.ndarray:
        """xi from the cosine similarities of the Gram matrix's rows."""
        params = self.cfg.params_as(HeurFedAMPParams)
        self._guard = False
        return heurfedamp_weights_from_gram(gram, params.heurfedamp_sigma, params.heurfedamp_tau, active)
