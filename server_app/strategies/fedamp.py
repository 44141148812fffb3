"""FedAMP and HeurFedAMP server half (papers/004 Alg. 1-2): attentive personalized cloud models, one per client."""

from __future__ import annotations

from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from common.attention import cloud_models, fedamp_weights_from_gram, heurfedamp_weights_from_gram
from common.config import ConfigError
from common.evaluate import CLOUD_PREFIX, shift_key
from common.validation import read_fraction

from .base import TrainReply, reply_flops
from .client_models import ClientModelsStrategy


class FedAMPStrategy(ClientModelsStrategy):
    """Keeps every client's latest model as a row of one float32 matrix; sends client i its own
    u_i = sum_j xi_ij w_j with FedAMP's exp-distance attention; clients train toward u_i with a proximal term.

    Clients not heard from in a round (not sampled, dropped, rejected) are used with their stored, stale rows.
    """

    name = "fedamp"
    sends_weights_for_eval = False
    extra_config = {"fedamp-alpha": 1.0, "fedamp-lambda": 1e-4, "fedamp-sigma": 100.0, "fedamp-decay": 0.1,
                    "fedamp-decay-every": 30, "heurfedamp-sigma": 25.0, "heurfedamp-tau": 0.95, "pretrain-epochs": 1}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        extra = self.cfg.extra
        self.alpha = float(extra.get("fedamp-alpha", 1.0))
        self.lam = float(extra.get("fedamp-lambda", 1e-4))
        self.decay = float(extra.get("fedamp-decay", 0.1))
        self.decay_every = max(1, int(extra.get("fedamp-decay-every", 30)))
        self.pretrain_epochs = int(extra.get("pretrain-epochs", 1))
        if self.alpha <= 0 or self.lam <= 0:
            raise ConfigError(f"run-config 'fedamp-alpha' = {self.alpha} and 'fedamp-lambda' = {self.lam} "
                              "must both be positive")
        self._pretraining = False
        self._guard = False
        self._self_weight: float | None = None

    # ----- attention -------------------------------------------------------------------------------
    def alpha_k(self, server_round: int) -> float:
        """alpha_k: the initial alpha times `fedamp-decay` every `fedamp-decay-every` rounds."""
        return self.alpha * self.decay ** ((server_round - 1) // self.decay_every)

    def attention(self, server_round: int) -> np.ndarray:
        """xi over all clients from the cached Gram matrix (FedAMP: exp-distance with the guard)."""
        xi, self._guard = fedamp_weights_from_gram(self.ensure_matrix().G, self.alpha_k(server_round),
                                                    float(self.cfg.extra.get("fedamp-sigma", 100.0)))
        if self._guard:
            log(WARNING, "round %d: some clients' off-diagonal attention summed above 1; rescaled to 1 "
                "(lower fedamp-alpha or raise fedamp-sigma to avoid it)", server_round)
        return xi

    # ----- messages --------------------------------------------------------------------------------
    def round_config(self, server_round: int, partition_id: int) -> ConfigRecord:
        """Adds the proximal coefficient lambda / alpha_k (or the pre-training flag)."""
        config = super().round_config(server_round, partition_id)
        if self._pretraining:
            config["pretrain"] = True
        else:
            config["prox-mu"] = self.lam / self.alpha_k(server_round)
        return config

    def shared_payload(self, server_round: int) -> dict[str, Any]:
        """Cloud models are per client and built on first use (see train_content)."""
        return {"global": self.global_record()} if self._pretraining else {}

    def train_content(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """u_i for this client (all the round's u_i come from one xi and one GEMM)."""
        config = self.round_config(server_round, partition_id)
        if self._pretraining:
            return RecordDict({"arrays": shared["global"], "config": config})
        if "cloud" not in shared:
            matrix = self.ensure_matrix()
            wanted = sorted(set(self.sample(server_round)) | {partition_id})
            rows = [self.rows[pid] for pid in wanted]
            xi = self.attention(server_round)
            # how much of u_i is w_i itself: ~1 means local training, ~1/m uniform averaging (tune sigma by it)
            self._self_weight = float(np.median(np.diag(xi)[rows]))
            shared["cloud"] = dict(zip(wanted, cloud_models(xi, matrix.W, rows)))
        u = shared["cloud"].get(partition_id)
        if u is None:
            row = self.rows[partition_id]
            u = cloud_models(self.attention(server_round), self.ensure_matrix().W, [row])[0]
        return RecordDict({"arrays": self.model_record(u), "config": config})

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """Store each reply as its client's new row (and the Gram matrix's row/column)."""
        self.store_replies(replies)

    def before_first_round(self, grid: Grid) -> None:
        """Every client trains `pretrain-epochs` locally from the common initialization; that becomes its row."""
        self.ensure_matrix()
        if self.pretrain_epochs <= 0:
            return
        self._pretraining = True
        try:
            clients = sorted(self.clients)
            # round 0: the clients' state of the pre-training precedes round 1's (see client_app.state.StateDir)
            messages = self._messages(0, clients, MessageType.TRAIN, "train_down")
            replies = list(grid.send_and_receive(messages, timeout=self.cfg.round_timeout))
            accepted, failed, rejected = self.accept_train_replies(replies, "pre-training")
            self.aggregate(0, accepted)
        finally:
            self._pretraining = False
        self.round_log.train["pretrain"] = {"sent": len(clients), "used": len(accepted), "failed": failed,
                                            "late": self.round_log.train.pop("late", 0),
                                            "rejected": rejected, "flops": sum(reply_flops(r.content) for r in accepted)}
        log(INFO, "pre-training: %d of %d clients trained %d local epoch(s) from the common initialization",
            len(accepted), len(clients), self.pretrain_epochs)

    def aggregate_train(self, server_round: int, replies):  # type: ignore[override]
        """As the base; round 1's training FLOPs include the pre-training."""
        out = super().aggregate_train(server_round, replies)
        self.round_log.train["flops"] += self.round_log.train.get("pretrain", {}).get("flops", 0.0)
        return out

    def extra_eval_metrics(self, metrics) -> dict[str, float]:
        """Accuracy of each client's last received cloud model u_i at every shift degree (when it has one)."""
        keys = [CLOUD_PREFIX + shift_key(d) for d in self.cfg.shift_degrees]
        return {key: read_fraction(metrics, key) for key in keys if metrics is not None and key in metrics}

    def extra_round_record(self, server_round: int) -> dict[str, Any]:
        """alpha_k, whether the guard fired, and how many rows are stale or never updated."""
        matrix = self.ensure_matrix()
        used = len(self.round_log.train.get("clients", []))
        return {"alpha_k": self.alpha_k(server_round), "guard": self._guard, "self_weight_median": self._self_weight,
                "stale_rows": matrix.num_clients - used, "never_heard": int((~matrix.heard).sum())}


class HeurFedAMPStrategy(FedAMPStrategy):
    """HeurFedAMP (Alg. 2): u_i = (1 - tau) w_i + tau * sum_{j != i} softmax_j(sigma cos(w_i, w_j)) w_j."""

    name = "heurfedamp"

    def attention(self, server_round: int) -> np.ndarray:
        """xi from cosine similarities of the cached Gram matrix."""
        extra = self.cfg.extra
        self._guard = False
        return heurfedamp_weights_from_gram(self.ensure_matrix().G, float(extra.get("heurfedamp-sigma", 25.0)),
                                            float(extra.get("heurfedamp-tau", 0.95)))
