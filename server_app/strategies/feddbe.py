"""FedDBE on the server: round 0 gathers every client's mean representation into the global mean (once, as the
authors' code), sent with every later training message; the models are averaged as FedAvg's (Zhang et al.,
"Eliminating Domain Bias for Federated Learning in Representation Space", NeurIPS 2023)."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import RecordDict

from common.config import ConfigError, RunConfig
from common.learning.models import ModelLayout
from common.methods.feddbe import feature_size
from common.methods.robust import robust_average
from common.secagg.encoding import Decoded
from common.secagg.wire import beside
from common.wire.messages import ARRAYS, CONFIG, FEATURE_MEAN, PRETRAIN
from common.wire.records import to_record
from common.wire.validation import validate_arrays

from ..clients import ClientRegistry
from ..replies import TrainReply
from .fedavg import FedAvgStrategy

MEAN = "mean"


class FedDBEStrategy(FedAvgStrategy):
    """Round 0: the clients' means, combined by the run's robust rule (sample-weighted without one); rounds 1+:
    the global model and the global mean to each client, FedAvg's aggregation of the models."""

    def __init__(self, cfg: RunConfig, model: ModelLayout, clients: ClientRegistry) -> None:
        super().__init__(cfg, model, clients)
        try:
            self.feature_size = feature_size(model.specs)
        except ValueError as exc:
            raise ConfigError(f"run-config 'model' {cfg.model!r}: {exc}") from None
        self.round0: list[tuple[np.ndarray, float]] = []  # the round-0 means and sample counts, until combined
        self.global_mean: np.ndarray | None = None

    def warmup_round(self) -> bool:
        """Round 0 is every client's plain training that measures its mean representation."""
        return True

    def mean_record(self) -> Any:
        """The global mean as a record (None while no client has answered round 0)."""
        if self.global_mean is None and self.round0:
            means = [[mean] for mean, _ in self.round0]
            weights = [weight for _, weight in self.round0]
            zero = [np.zeros(self.feature_size, np.float32)]
            combined, _ = robust_average(means, weights, zero, self.cfg.robust_rule)
            self.global_mean, self.round0 = combined[0].astype(np.float32), []
        return None if self.global_mean is None else to_record([MEAN], [self.global_mean])

    def shared_payload(self, server_round: int) -> dict[str, Any]:
        """FedAvg's, plus the global mean after round 0."""
        payload = super().shared_payload(server_round)
        mean = None if server_round == 0 else self.mean_record()
        return payload if mean is None else {**payload, FEATURE_MEAN: mean}

    def train_content(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """The global model with the round-0 flag, or with the global mean."""
        config = self.round_config(server_round, partition_id)
        content = RecordDict({ARRAYS: shared["global"], CONFIG: config})
        if server_round == 0:
            config[PRETRAIN] = True
        elif FEATURE_MEAN in shared:
            content[FEATURE_MEAN] = shared[FEATURE_MEAN]
        return content

    def decode_train_reply(self, server_round: int, reply: TrainReply) -> None:
        """Round 0: one finite mean of the feature size, and no model; later: FedAvg's."""
        if server_round != 0:
            super().decode_train_reply(server_round, reply)
            return
        reply.payload = validate_arrays(reply.content.array_records.get(FEATURE_MEAN), [(MEAN, (self.feature_size,))])[
            0
        ]

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """Round 0 (a window of replies at a time): keep each mean; later rounds: FedAvg's average."""
        if server_round == 0:
            self.round0.extend((np.asarray(r.payload, np.float32), r.weight) for r in replies)
            return
        super().aggregate(server_round, replies)

    def secure_layout(self, server_round: int) -> tuple[list[tuple[str, int]], list[str]]:
        """Under `secagg`: round 0's vector carries each client's mean representation (sample-weighted in the sum,
        as the plain round 0 combines them); later rounds the model, as FedAvg's."""
        if server_round == 0:
            return [(beside(FEATURE_MEAN, MEAN), self.feature_size)], []
        return super().secure_layout(server_round)

    def aggregate_secure(self, server_round: int, decoded: Decoded, survivors: int, loss: float) -> None:
        """Under `secagg`: round 0's sum is the global mean itself; later rounds FedAvg's."""
        if server_round != 0:
            super().aggregate_secure(server_round, decoded, survivors, loss)
            return
        self.global_mean, self.round0 = decoded.mean(beside(FEATURE_MEAN, MEAN)).astype(np.float32), []

    def state_dict(self) -> dict[str, Any]:
        """FedAvg's, plus the global mean (and any round-0 means not yet combined)."""
        return {
            **super().state_dict(),
            "global_mean": None if self.global_mean is None else self.global_mean,
            "round0": [(mean, weight) for mean, weight in self.round0],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """FedAvg's, plus the global mean (shape and finite values checked)."""
        super().load_state_dict(state)
        mean = state.get("global_mean")
        if mean is not None:
            mean = np.asarray(mean, np.float32)
            if mean.shape != (self.feature_size,) or not np.all(np.isfinite(mean)):
                raise ValueError("checkpoint's FedDBE global mean does not match the configured model")
        self.global_mean = mean
        self.round0 = [(np.asarray(m, np.float32), float(w)) for m, w in state.get("round0", [])]
