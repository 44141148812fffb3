"""FedCP's client half: the received feature extractor, global head and policy network with this client's own head;
the policy splits each sample's features between the two heads, the MMD to the received extractor's features
regularizes; the extractor and the policy are uploaded with the mean of the personal and the received global head,
the personal head kept (Zhang et al., "FedCP: Separating Feature Information for Personalized Federated Learning via
Conditional Policy", KDD 2023)."""

from __future__ import annotations

from functools import lru_cache

import torch
from flwr.app import RecordDict

from common.algorithms import FedCPParams
from common.learning.flops import training_flops
from common.learning.models import ModelLayout, get_arrays, model_layout, set_arrays
from common.methods.fedcp import (
    FedCPModel,
    added_flops_per_sample,
    added_layout_of,
    added_modules,
    fedcp_loss,
    upload_head,
)
from common.seeding import derive_seed
from common.wire.messages import ARRAYS
from common.wire.records import to_record
from common.wire.validation import validate_arrays

from .base import ClientAlgorithm, ClientEnv

HEAD = "fedcp/head"  # this client's personal head (its state-dict order)


@lru_cache(maxsize=4)
def _layout(model: str, dataset: str, shape: tuple[int, ...], classes: int, seed: int) -> ModelLayout:
    return added_layout_of(model_layout(model, dataset, shape, classes, derive_seed(seed, "model")), seed)


class FedCPClient(ClientAlgorithm):
    """Trains the body, the policy and the personal head of a FedCPModel; its combined logits are what evaluation
    reports."""

    def __init__(self, env: ClientEnv) -> None:
        super().__init__(env)
        data = env.data
        layout = _layout(self.cfg.model, self.cfg.dataset, tuple(data.input_shape), data.num_classes, self.cfg.seed)
        self.specs = layout.specs
        self.names = [name for name, _ in layout.specs]
        self.features = layout.linear_head()[0]

    def own_model(self, content: RecordDict, server_round: int, purpose: str) -> FedCPModel:
        """The received entries with this client's personal head (the common initialization's before it trained),
        the Gumbel noise seeded by (round, `purpose`)."""
        params = self.cfg.params_as(FedCPParams)
        received = dict(zip(self.names, validate_arrays(content.array_records.get(ARRAYS), self.specs)))
        split = self.new_model()
        kept = self.env.state.load_arrays(HEAD)
        personal = kept if kept is not None else get_arrays(split.head)
        added = added_modules(self.features, derive_seed(self.cfg.seed, "fedcp-modules"))
        model = FedCPModel(split, added, params.fedcp_tau, self.generator(server_round, purpose))
        values = {
            **received,
            **{f"received_{name}": value for name, value in received.items() if name.startswith("body.")},
            **{f"personal.{key}": value for key, value in zip(split.head.state_dict(), personal)},
        }
        set_arrays(model, [values[name] for name in model.state_dict()])
        return model.set_context()

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Train for `local-epochs`, keep the personal head, upload the rest with the global head mixed."""
        params = self.cfg.params_as(FedCPParams)
        model = self.own_model(content, server_round, "fedcp-policy")
        before = self.snapshot(model)
        frozen = model.frozen()
        trainable = {name for name, _ in model.named_parameters() if name not in frozen}
        stats = self.train_locally(model, server_round, batch_loss=fedcp_loss(params.fedcp_lambda), trainable=trainable)
        self.env.state.save_arrays(HEAD, get_arrays(model.personal))
        data = self.env.data
        mmd = params.fedcp_lambda > 0
        per_sample = added_flops_per_sample(self.features, data.num_classes, mmd, self.cfg.training.batch_size)
        added = training_flops(per_sample, stats.num_samples, self.cfg.local_epochs if stats.steps else 0)
        reference = self.forward_flops(stats, "body.") if mmd else 0.0
        flops = self.train_flops(stats) + added + reference
        reply = self.train_reply(stats, None, stages={"L1": before, "L2": model}, flops=flops)
        with torch.no_grad():
            named = {name: tensor.detach() for name, tensor in model.state_dict().items()}
            for key in model.personal.state_dict():
                named[f"head.{key}"] = upload_head(named[f"personal.{key}"], named[f"head.{key}"])
        reply[ARRAYS] = to_record(self.names, [named[name].cpu().numpy() for name in self.names])
        return reply

    def newcomer_model(self, content: RecordDict) -> FedCPModel:
        """The received entries with the common initialization's head as the personal one (a new client's)."""
        return self.own_model(content, 0, "fedcp-newcomer")

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """The combined logits with this client's personal head."""
        return self.eval_reply(self.evaluate_model(self.own_model(content, server_round, "fedcp-eval")))
