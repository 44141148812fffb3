"""SCAFFOLD on the server: the global model x and the control variate c; x moves by the server learning rate along
the round's mean model update, c by the clients' changes of their own control variates (Karimireddy et al.,
"SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020, Algorithm 1)."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import RecordDict

from common.algorithms import ScaffoldParams
from common.config import ConfigError, RunConfig
from common.learning.models import ModelLayout
from common.methods.aggregate import server_step
from common.methods.robust import robust_average
from common.methods.scaffold import server_control
from common.secagg.encoding import Decoded
from common.secagg.wire import beside
from common.wire.messages import ARRAYS, CONFIG, CONTROL
from common.wire.records import to_record
from common.wire.validation import validate_arrays

from ..clients import ClientRegistry
from ..replies import TrainReply
from .base import PFLStrategy


class ScaffoldStrategy(PFLStrategy):
    """Sends x and c; each reply carries the client's trained model y_i and its change of c_i. The round's models are
    averaged uniformly over the replies (the paper's 1/|S|), through the run's robust rule and peer bound as FedAvg's,
    and x <- x + eta_g (mean y_i - x); c <- c + (1/N) sum delta c_i (the changes averaged by the same rule)."""

    def __init__(self, cfg: RunConfig, model: ModelLayout, clients: ClientRegistry) -> None:
        super().__init__(cfg, model, clients)
        if cfg.optimizer != "sgd":
            raise ConfigError(
                "scaffold corrects plain SGD steps (its option II reads the step size off the distance travelled): "
                "run-config 'optimizer' must be 'sgd'"
            )
        params = set(model.params)
        self.control_specs = [(name, shape) for name, shape in self.specs if name in params]
        self.control = [np.zeros(shape, np.float32) for _, shape in self.control_specs]
        self.server_lr = cfg.params_as(ScaffoldParams).scaffold_server_lr

    def shared_payload(self, server_round: int) -> dict[str, Any]:
        """The global model and the control variate c, once per round."""
        names = [name for name, _ in self.control_specs]
        return {**super().shared_payload(server_round), CONTROL: to_record(names, self.control)}

    def train_content(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """x and c."""
        config = self.round_config(server_round, partition_id)
        return RecordDict({ARRAYS: shared["global"], CONTROL: shared[CONTROL], CONFIG: config})

    def decode_train_reply(self, server_round: int, reply: TrainReply) -> None:
        """The model as FedAvg's, and the change of c_i: one finite float32 array per trainable parameter."""
        super().decode_train_reply(server_round, reply)
        reply.payload = validate_arrays(reply.content.array_records.get(CONTROL), self.control_specs)

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """x <- x + eta_g (mean y_i - x); c <- c + (|S| / N) mean delta c_i."""
        if not replies:
            return
        uniform = [1.0] * len(replies)
        mean_model = self.average(replies, uniform, self.global_arrays)
        self.global_arrays = server_step(self.global_arrays, mean_model, self.server_lr)
        zero = [np.zeros_like(c) for c in self.control]
        deltas = [reply.payload for reply in replies]
        if self.cfg.max_update_ratio > 0:  # a change of c_i as long as the peers' bounds like a model update
            deltas = [list(d) for d in self.bound_to_peers(deltas, zero)]
        mean_delta, _ = robust_average(deltas, uniform, zero, self.cfg.robust_rule)
        self.control = server_control(self.control, mean_delta, len(replies), len(self.clients.ids()))

    def secure_specs(self) -> list[tuple[str, tuple[int, ...]]]:
        """Under `secagg` the masked vector carries the model and, beside it, each client's change of c_i."""
        return [*super().secure_specs(), *[(beside(CONTROL, name), shape) for name, shape in self.control_specs]]

    def aggregate_secure(self, server_round: int, decoded: Decoded, survivors: int, loss: float) -> None:
        """Under `secagg`, from the cohort's sum (each client weighing the same: the spec's equal weights): x <- x +
        eta_g (mean y_i - x); c <- c + (|S| / N) mean delta c_i, with |S| the clients in the sum."""
        mean_model = [decoded.mean(name).reshape(shape).astype(np.float32) for name, shape in self.specs]
        self.global_arrays = server_step(self.global_arrays, mean_model, self.server_lr)
        mean_delta = [
            decoded.mean(beside(CONTROL, name)).reshape(shape).astype(np.float32) for name, shape in self.control_specs
        ]
        self.control = server_control(self.control, mean_delta, survivors, len(self.clients.ids()))

    def state_dict(self) -> dict[str, Any]:
        """FedAvg's, plus c."""
        return {**super().state_dict(), "control": list(self.control)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """FedAvg's, plus c (shapes and finite values checked)."""
        super().load_state_dict(state)
        control = [np.asarray(a, dtype=np.float32) for a in state["control"]]
        if [a.shape for a in control] != [tuple(shape) for _, shape in self.control_specs]:
            raise ValueError("checkpoint's control variate does not match the configured model")
        if not all(np.all(np.isfinite(a)) for a in control):
            raise ValueError("checkpoint's control variate has NaN or Inf values")
        self.control = control
