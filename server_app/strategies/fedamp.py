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
from common.learning.models import ModelLayout
from common.methods.attention import cloud_models, fedamp_weights_from_gram, heurfedamp_weights_from_gram
from common.wire.messages import ARRAYS, CONFIG, PRETRAIN, PROX_MU

from ..clients import ClientRegistry
from ..replies import TrainReply
from .client_models import ClientModelsStrategy


class FedAMPStrategy(ClientModelsStrategy):
    """Keeps every client's latest model as a row of one float32 matrix; sends client i its own
    u_i = sum_j xi_ij w_j with FedAMP's exp-distance attention; clients train toward u_i with a proximal term.

    Round 0 (when `pretrain-epochs` > 0): every client trains from the common initialization; that becomes its
    row. Clients not heard from in a round (not sampled, dropped, rejected) are used with their stored, stale rows.
    """

    sends_weights_for_eval = False

    def __init__(self, cfg: RunConfig, model: ModelLayout, clients: ClientRegistry) -> None:
        super().__init__(cfg, model, clients)
        self.amp = cfg.params_as(AMPParams)
        self._guard = False
        self._self_weight: float | None = None
        self._stored = (0, 0)  # (round, rows it updated)
        self._last_xi: np.ndarray | None = None

    # ----- attention -------------------------------------------------------------------------------
    def alpha_k(self, server_round: int) -> float:
        """alpha_k: the initial alpha times `fedamp-decay` every `fedamp-decay-every` rounds."""
        return self.amp.fedamp_alpha * self.amp.fedamp_decay ** ((server_round - 1) // self.amp.fedamp_decay_every)

    def attention(self, server_round: int) -> np.ndarray:
        """xi over all clients from the cached Gram matrix (FedAMP: exp-distance with the guard)."""
        params = self.cfg.params_as(FedAMPParams)
        tau = params.fedamp_tau if params.fedamp_tau >= 0 else None
        xi, self._guard = fedamp_weights_from_gram(
            self.ensure_matrix().G, self.alpha_k(server_round), params.fedamp_sigma, tau=tau
        )
        if self._guard:
            log(
                WARNING,
                "round %d: some clients' off-diagonal attention summed above 1; rescaled to 1 "
                "(lower fedamp-alpha or raise fedamp-sigma to avoid it)",
                server_round,
            )
        self._last_xi = xi
        return xi

    def artifacts(self) -> dict[str, np.ndarray]:
        """The last attention matrix xi and its rows' partition ids (the report's heatmap)."""
        if self._last_xi is None:
            return {}
        return {"attention": self._last_xi, "attention_clients": np.asarray(self.pids)}

    # ----- messages --------------------------------------------------------------------------------
    def warmup_round(self) -> bool:
        """Round 0 is the clients' local pre-training (`pretrain-epochs` > 0)."""
        return self.amp.pretrain_epochs > 0

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
        """u_i for this client (all the round's u_i come from one xi and one GEMM)."""
        config = self.round_config(server_round, partition_id)
        if server_round == 0:
            return RecordDict({ARRAYS: shared["global"], CONFIG: config})
        matrix = self.ensure_matrix()
        if "cloud" not in shared:
            wanted = sorted(set(self.sample(server_round)) | {partition_id})
            rows = [self.rows[pid] for pid in wanted]
            xi = self.attention(server_round)
            # how much of u_i is w_i itself: ~1 means local training, ~1/m uniform averaging (tune sigma by it)
            self._self_weight = float(np.median(np.diag(xi)[rows]))
            shared["cloud"] = dict(zip(wanted, cloud_models(xi, matrix.W, rows)))
        u = shared["cloud"].get(partition_id)
        if u is None:
            u = cloud_models(self.attention(server_round), matrix.W, [self.rows[partition_id]])[0]
        return RecordDict({ARRAYS: self.model_record(u), CONFIG: config})

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """Store each reply as its client's new row (and the Gram matrix's row/column)."""
        self.store_replies(replies)
        self._stored = (server_round, len(replies))

    def round_record(self, server_round: int) -> dict[str, Any]:
        """alpha_k, whether the guard fired, and how many rows are stale or never updated."""
        matrix = self.ensure_matrix()
        updated = self._stored[1] if self._stored[0] == server_round else 0
        return {
            "alpha_k": self.alpha_k(server_round),
            "guard": self._guard,
            "self_weight_median": self._self_weight,
            "stale_rows": matrix.num_clients - updated,
            "never_heard": int((~matrix.heard).sum()),
        }


class HeurFedAMPStrategy(FedAMPStrategy):
    """HeurFedAMP (Alg. 2): u_i = (1 - tau) w_i + tau * sum_{j != i} softmax_j(sigma cos(w_i, w_j)) w_j."""

    def attention(self, server_round: int) -> np.ndarray:
        """xi from cosine similarities of the cached Gram matrix."""
        params = self.cfg.params_as(HeurFedAMPParams)
        self._guard = False
        return heurfedamp_weights_from_gram(self.ensure_matrix().G, params.heurfedamp_sigma, params.heurfedamp_tau)
