"""GPFL's client half: the received body, global category embedding (GCE) and conditional valve (CoV) with this
client's own head; one loss trains all four (the personalized path's cross-entropy, the GCE's loss on the global
path, the pull of the global path's features toward the received embeddings of their labels, weight decay on GCE
and CoV); all but the head is uploaded, the head kept (Zhang et al., "GPFL: Simultaneously Learning Global and
Personalized Feature Information for Personalized Federated Learning", ICCV 2023)."""

from __future__ import annotations

from functools import lru_cache

from flwr.app import RecordDict

from common.algorithms import GPFLParams
from common.learning.flops import training_flops
from common.learning.models import ModelLayout, get_arrays, model_layout, set_arrays
from common.methods.gpfl import (
    GPFLModel,
    added_flops_per_sample,
    added_layout_of,
    added_modules,
    class_share,
    gpfl_loss,
)
from common.methods.personal import shared_names
from common.seeding import derive_seed
from common.wire.messages import ARRAYS
from common.wire.records import to_record
from common.wire.validation import validate_arrays

from .base import ClientAlgorithm, ClientEnv

HEAD = "gpfl/head"  # this client's head (its state-dict order)


@lru_cache(maxsize=4)
def _layout(model: str, dataset: str, shape: tuple[int, ...], classes: int, seed: int) -> ModelLayout:
    return added_layout_of(model_layout(model, dataset, shape, classes, derive_seed(seed, "model")), seed)


class GPFLClient(ClientAlgorithm):
    """Trains the whole GPFLModel; the personalized path is what evaluation reports."""

    def __init__(self, env: ClientEnv) -> None:
        super().__init__(env)
        data = env.data
        layout = _layout(self.cfg.model, self.cfg.dataset, tuple(data.input_shape), data.num_classes, self.cfg.seed)
        self.names = [name for name, _ in layout.specs]
        self.shared = shared_names(self.names, "no-head")
        self.shared_specs = [(name, shape) for name, shape in layout.specs if name in set(self.shared)]
        self.features = dict(layout.specs)["head.weight"][1]

    def own_model(self, content: RecordDict) -> GPFLModel:
        """The received shared entries with this client's head (the common initialization's before it trained)."""
        data = self.env.data
        model = self.new_model()
        added = added_modules(self.features, data.num_classes, derive_seed(self.cfg.seed, "gpfl-modules"))
        gpfl = GPFLModel(model, added)
        received = dict(zip(self.shared, validate_arrays(content.array_records.get(ARRAYS), self.shared_specs)))
        head = self.env.state.load_arrays(HEAD)
        heads = dict(zip(model.head_names(), head if head is not None else get_arrays(model.head)))
        current = dict(zip(self.names, get_arrays(gpfl)))
        set_arrays(gpfl, [received.get(name, heads.get(name, current[name])) for name in self.names])
        return gpfl.condition(class_share(data.train_y, data.num_classes))

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Train for `local-epochs`, keep the head, upload the rest."""
        params = self.cfg.params_as(GPFLParams)
        model = self.own_model(content)
        before = self.snapshot(model)
        stats = self.train_locally(model, server_round, batch_loss=gpfl_loss(params.gpfl_lambda, params.gpfl_mu))
        self.env.state.save_arrays(HEAD, get_arrays(model.head))
        per_sample = added_flops_per_sample(self.features, self.env.data.num_classes, self.cfg.training.batch_size)
        added = training_flops(per_sample, stats.num_samples, self.cfg.local_epochs if stats.steps else 0)
        reply = self.train_reply(stats, None, stages={"L1": before, "L2": model}, flops=self.train_flops(stats) + added)
        named = dict(zip(self.names, get_arrays(model)))
        reply[ARRAYS] = to_record(self.shared, [named[name] for name in self.shared])
        return reply

    def newcomer_model(self, content: RecordDict) -> GPFLModel:
        """The received body, GCE and CoV with the common initialization's head (a new client's)."""
        return self.own_model(content)

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """The personalized path with this client's head."""
        return self.eval_reply(self.evaluate_model(self.own_model(content)))
