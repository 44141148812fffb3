"""Client half of the split methods: LG-FedAvg (global head), FedPer and FedRep (global body), FedBN (all but
batch-norm layers). The client keeps its whole model; only the shared part comes and goes.

Paper: Zhang, Zhou, Wang, Tong, "DM-PFL: Hitchhiking Generic Federated Learning for Efficient Shift-Robust
Personalization", KDD 2023, doi:10.1145/3580305.3599311 (not on arXiv)."""

from __future__ import annotations

from flwr.app import RecordDict

from common.algorithms import SPECS
from common.learning.models import SplitModel, get_arrays, set_arrays
from common.learning.train import TrainStats
from common.methods.personal import shared_names
from common.wire.messages import ARRAYS
from common.wire.records import to_record
from common.wire.validation import validate_arrays

from .base import ClientAlgorithm, ClientEnv
from .local import PERSONAL


class PartialClient(ClientAlgorithm):
    """Trains its own model with the received shared part in place (body and head together: LG-FedAvg, FedPer,
    FedBN); keeps the whole model in client state and uploads the shared part only."""

    def __init__(self, env: ClientEnv) -> None:
        super().__init__(env)
        layout = self.layout()
        self.specs = layout.specs
        self.names = [name for name, _ in self.specs]
        self.shared = shared_names(self.names, SPECS[self.cfg.algorithm].shares, layout.norm)
        self.shared_specs = [(name, shape) for name, shape in self.specs if name in set(self.shared)]

    def own_model(self, content: RecordDict) -> SplitModel:
        """This client's model (stored, or the common initialization) with the received shared entries in place."""
        model = self.stored_model(PERSONAL)
        received = dict(zip(self.shared, validate_arrays(content.array_records.get(ARRAYS), self.shared_specs)))
        set_arrays(model, [received.get(name, value) for name, value in zip(self.names, get_arrays(model))])
        return model

    def local_training(self, server_round: int, model: SplitModel) -> tuple[TrainStats, float]:
        """Train every parameter for `local-epochs`; the statistics and the training FLOPs."""
        stats = self.train_locally(model, server_round)
        return stats, self.train_flops(stats)

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Train the own model, keep it, upload the shared entries (stages: L1 before, L2 after training)."""
        model = self.own_model(content)
        before = self.snapshot(model)
        stats, flops = self.local_training(server_round, model)
        arrays = get_arrays(model)
        self.env.state.save_arrays(PERSONAL, arrays)
        reply = self.train_reply(stats, None, stages={"L1": before, "L2": model}, flops=flops)
        named = dict(zip(self.names, arrays))
        reply[ARRAYS] = to_record(self.shared, [named[name] for name in self.shared])
        return reply

    def newcomer_model(self, content: RecordDict) -> SplitModel:
        """The common initialization with the received shared part (a new client has no part of its own yet)."""
        return self.own_model(content)

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """The own model with the current shared part."""
        return self.eval_reply(self.evaluate_model(self.own_model(content)))


class FedRepClient(PartialClient):
    """FedRep (Collins et al., 2021): `local-epochs` on the head with the body frozen, then as many on the body with
    the head frozen (DM-PFL [KDD 2023] A.1.4: the extra steps equal the local steps)."""

    def local_training(self, server_round: int, model: SplitModel) -> tuple[TrainStats, float]:
        """Head epochs, then body epochs; FLOPs of each phase counted with its frozen part."""
        head = {name for name, _ in model.named_parameters() if name.startswith("head.")}
        body = {name for name, _ in model.named_parameters() if name.startswith("body.")}
        head_stats = self.train_locally(model, server_round, "head", trainable=head)
        body_stats = self.train_locally(model, server_round, trainable=body)
        flops = self.train_flops(head_stats, trainable=head) + self.train_flops(body_stats, trainable=body)
        return body_stats, flops
