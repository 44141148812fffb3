"""Server half of the split methods (LG-FedAvg, FedPer, FedRep, FedBN): only the shared part of the model travels
and is averaged; the rest stays on each device."""

from __future__ import annotations

from collections.abc import Callable

from flwr.app import ArrayRecord

from common.algorithms import SPECS
from common.config import ConfigError, RunConfig
from common.learning.models import ModelLayout
from common.methods.personal import shared_names
from common.wire.messages import ARRAYS
from common.wire.records import to_record
from common.wire.validation import validate_arrays

from ..clients import ClientRegistry
from ..replies import TrainReply
from .base import PFLStrategy


class PartialStrategy(PFLStrategy):
    """Sends the shared entries of the global model (the spec's `shares` part) and averages the uploaded ones by
    sample count; entries that are not shared stay at the common initialization on the server."""

    def __init__(self, cfg: RunConfig, model: ModelLayout, clients: ClientRegistry) -> None:
        super().__init__(cfg, model, clients)
        part = SPECS[cfg.algorithm].shares
        names = [name for name, _ in self.specs]
        self.shared = shared_names(names, part, model.norm)
        if part == "no-norm" and not model.norm:
            raise ConfigError(
                f"{cfg.algorithm} keeps batch-norm layers local and needs a model with them: "
                "run-config 'model' = 'mlp-bn', 'cnn-mnist-bn' or 'cnn-cifar-bn'"
            )
        if not self.shared or len(self.shared) == len(names) and part != "all":
            raise ConfigError(
                f"{cfg.algorithm} shares the model's {part}, which this model splits into "
                f"{len(self.shared)} of {len(names)} entries"
            )
        self.index = {name: i for i, name in enumerate(names)}
        self.shared_specs = [(name, shape) for name, shape in self.specs if name in set(self.shared)]

    def global_record(self) -> ArrayRecord:
        """The shared entries of the global model."""
        return to_record(self.shared, [self.global_arrays[self.index[name]] for name in self.shared])

    def decode_train_reply(self, server_round: int, reply: TrainReply) -> None:
        """The upload must hold exactly the shared entries, float32, finite, of the model's shapes."""
        reply.arrays = validate_arrays(reply.content.array_records.get(ARRAYS), self.shared_specs)

    def secure_specs(self) -> list[tuple[str, tuple[int, ...]]]:
        """The shared entries: what a masked vector carries under run-config `secagg`."""
        return list(self.shared_specs)

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """Sample-weighted average of the shared entries; the others keep their values."""
        shared = [self.global_arrays[self.index[name]] for name in self.shared]
        averaged = self.average(replies, [r.weight for r in replies], shared)
        for name, value in zip(self.shared, averaged):
            self.global_arrays[self.index[name]] = value


class AddedModulesStrategy(PartialStrategy):
    """PartialStrategy over the model's layout extended by a method's modules beside the model (GPFL's, FedCP's):
    `add_modules` maps the model's layout and the run's seed to the extended one (ValueError: a model it cannot
    extend)."""

    add_modules: Callable[[ModelLayout, int], ModelLayout]

    def __init__(self, cfg: RunConfig, model: ModelLayout, clients: ClientRegistry) -> None:
        try:
            extended = type(self).add_modules(model, cfg.seed)
        except ValueError as exc:
            message = f"run-config 'model' {cfg.model!r}: {cfg.algorithm} cannot add its modules: {exc}"
            raise ConfigError(message) from None
        super().__init__(cfg, extended, clients)
