"""FedFomo server half (Personalized Federated Learning with First Order Model Optimization [arXiv:2012.08565],
Sec. 3): each client downloads M peers' models chosen by affinity."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from common.algorithms import FedFomoParams
from common.config import RunConfig
from common.learning.models import ModelLayout
from common.methods.attention import ModelMatrix
from common.methods.fomo import WEIGHT_KEY, choose_peers
from common.seeding import derive_seed
from common.wire.messages import CONFIG, METRICS, PEER_IDS
from common.wire.validation import PayloadError

from ..clients import ClientRegistry
from ..replies import TrainReply
from .client_models import ClientModelsStrategy


class FedFomoStrategy(ClientModelsStrategy):
    """Keeps the clients' latest models and an affinity matrix P; P[i, j] grows by the weight client i gave j."""

    sends_weights_for_eval = False
    track_gram = False

    def __init__(self, cfg: RunConfig, model: ModelLayout, clients: ClientRegistry) -> None:
        super().__init__(cfg, model, clients)
        self.params = cfg.params_as(FedFomoParams)
        self.affinity = np.zeros((0, 0))
        self.sent_peers: dict[int, list[int]] = {}

    def ensure_matrix(self) -> ModelMatrix:
        """Model rows (no Gram matrix needed) and the affinity matrix, built on first use."""
        matrix = super().ensure_matrix()
        if self.affinity.shape[0] != matrix.num_clients:
            self.affinity = np.zeros((matrix.num_clients, matrix.num_clients))
        return matrix

    def state_dict(self) -> dict[str, Any]:
        """The client models and the affinity matrix."""
        return {**super().state_dict(), "affinity": self.affinity}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the client models and the affinity matrix."""
        super().load_state_dict(state)
        affinity = np.asarray(state["affinity"], dtype=np.float64)
        rows = len(self.pids)
        if affinity.shape != (rows, rows) or not np.all(np.isfinite(affinity)) or np.any(affinity < 0):
            raise ValueError(
                f"checkpoint's affinity matrix {affinity.shape} is not a finite non-negative {rows} x {rows} matrix"
            )
        self.affinity = affinity

    def peers_for(self, server_round: int, partition_id: int) -> list[int]:
        """Partition ids of the peers whose models this client receives (only clients heard from)."""
        matrix = self.ensure_matrix()
        row = self.rows[partition_id]
        candidates = np.flatnonzero(matrix.heard)
        candidates = candidates[candidates != row]
        rng = np.random.default_rng(derive_seed(self.cfg.seed, "fomo-peers", server_round, partition_id))
        epsilon = self.params.fomo_epsilon * self.params.fomo_epsilon_decay ** (server_round - 1)
        chosen = choose_peers(self.affinity[row], candidates, self.params.fomo_models, epsilon, rng)
        return [self.pids[r] for r in chosen]

    def round_config(self, server_round: int, partition_id: int) -> ConfigRecord:
        """Adds the ids of the peers sent."""
        config = super().round_config(server_round, partition_id)
        config[PEER_IDS] = list(self.sent_peers.get(partition_id, []))
        return config

    def shared_payload(self, server_round: int) -> dict[str, Any]:
        """Peer records are built per client (see train_content)."""
        self.ensure_matrix()
        return {}

    def train_content(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """The chosen peers' models as records 'peer-0' ... 'peer-{M-1}'."""
        peers = self.peers_for(server_round, partition_id)
        self.sent_peers[partition_id] = peers
        matrix = self.ensure_matrix()
        content = RecordDict({CONFIG: self.round_config(server_round, partition_id)})
        for k, peer in enumerate(peers):
            content[f"peer-{k}"] = self.model_record(matrix.W[self.rows[peer]])
        return content

    def decode_train_reply(self, server_round: int, reply: TrainReply) -> None:
        """The model, plus one finite non-negative weight per peer sent this round."""
        super().decode_train_reply(server_round, reply)
        metrics = reply.content.metric_records.get(METRICS)
        weights = []
        for k in range(len(self.sent_peers.get(reply.partition_id, []))):
            value = metrics.get(WEIGHT_KEY.format(k)) if metrics is not None else None
            if not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
                raise PayloadError(f"metric '{WEIGHT_KEY.format(k)}' = {value!r} must be a finite weight >= 0")
            weights.append(float(value))
        if any(w > 1.0 for w in weights) or sum(weights) > 1.0 + 1e-6:  # the client normalizes them (fomo_weights)
            shown = [round(w, 6) for w in weights][:5]
            raise PayloadError(f"peer weights {shown} must be at most 1 and sum to at most 1")
        reply.payload = weights

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """Store the new models; add each client's peer weights to its affinity row."""
        self.ensure_matrix()
        for reply in replies:
            row = self.rows[reply.partition_id]
            for peer, weight in zip(self.sent_peers.get(reply.partition_id, []), reply.payload or []):
                self.affinity[row, self.rows[peer]] += weight
        self.store_replies(replies)
