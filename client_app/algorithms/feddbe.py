"""FedDBE's client half: round 0 trains the received model plainly and reports the mean representation; later
rounds train the received model with the personal bias vector on its features and the mean regularization toward
the global mean, upload the model for FedAvg's average and keep the bias (Zhang et al., "Eliminating Domain Bias for
Federated Learning in Representation Space", NeurIPS 2023, Algorithm 1)."""

from __future__ import annotations

import torch
from flwr.app import RecordDict

from common.algorithms import GLOBAL, FedDBEParams
from common.learning.models import SplitModel
from common.methods.feddbe import DBEModel, RunningMean, dbe_loss, feature_size
from common.wire.messages import FEATURE_MEAN, PRETRAIN
from common.wire.records import to_record
from common.wire.validation import validate_arrays

from .base import ClientAlgorithm

BIAS = "feddbe/bias"  # the personalized representation bias memory
MEAN = "mean"  # the one entry of the feature-mean record


class FedDBEClient(ClientAlgorithm):
    """Trains model and bias together (one optimizer: the authors' two plain SGDs share the learning rate)."""

    def with_bias(self, model: SplitModel) -> DBEModel:
        """`model` with this client's bias vector (zeros before its first training with the global mean)."""
        saved = self.env.state.load_arrays(BIAS)
        size = feature_size(self.layout().specs)
        bias = torch.zeros(size) if saved is None else torch.from_numpy(saved[0].copy())
        return DBEModel(model, bias)

    def global_mean(self, content: RecordDict) -> torch.Tensor | None:
        """The global mean representation the server sent (None: it has none yet)."""
        record = content.array_records.get(FEATURE_MEAN)
        if record is None:
            return None
        size = feature_size(self.layout().specs)
        return torch.from_numpy(validate_arrays(record, [(MEAN, (size,))])[0].copy())

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Round 0: plain training, the mean representation reported (no model). Later: DBE's training, the
        model uploaded, the bias kept."""
        params = self.cfg.params_as(FedDBEParams)
        received = self.received_model(content)
        before = self.snapshot(received)
        model = self.with_bias(received)
        pretrain = self.instructions(content).get(PRETRAIN, False) is True
        global_mean = None if pretrain else self.global_mean(content)
        running = RunningMean(feature_size(self.layout().specs), params.feddbe_momentum)
        loss = dbe_loss(running, global_mean, params.feddbe_kappa)
        stats = self.train_locally(model, server_round, batch_loss=loss)
        if pretrain:
            reply = self.train_reply(stats, None)
            reply[FEATURE_MEAN] = to_record([MEAN], [running.value.numpy().astype("float32")])
            return reply
        if global_mean is not None:
            self.env.state.save_arrays(BIAS, [model.bias.detach().numpy().astype("float32")])
        return self.train_reply(stats, received, stages={"G": before, "L1": before, "L2": model})

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """The received model with the bias (main accuracy) and without ('global-' row)."""
        received = self.received_model_to_read(content)
        return self.eval_reply(self.evaluate_model(self.with_bias(received)), self.row(GLOBAL, received))
