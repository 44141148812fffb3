"""FedBABU's client half: the received body with the head at the run's common (random) initialization; local
training updates the body alone and only the body travels; to evaluate, the client fine-tunes a copy for
`fedbabu-finetune-epochs` (Oh, Kim, Yun, "FedBABU: Towards Enhanced Representation for Federated Image
Classification", ICLR 2022, Algorithm 1). The head never changes during federated training, so nothing is kept on the
device between messages."""

from __future__ import annotations

import dataclasses

from flwr.app import RecordDict

from common.algorithms import GLOBAL, FedBABUParams
from common.learning.models import SplitModel, get_arrays, set_arrays
from common.wire.messages import ARRAYS
from common.wire.records import to_record
from common.wire.validation import validate_arrays

from .base import ClientAlgorithm


class FedBABUClient(ClientAlgorithm):
    """Body update, body aggregation; fine-tuning (the whole model or the head) before every evaluation."""

    def model_with_body(self, content: RecordDict) -> tuple[SplitModel, list[str]]:
        """The common initialization with the received body in place, and the body's entry names."""
        layout = self.layout()
        body_specs = [(name, shape) for name, shape in layout.specs if name.startswith("body.")]
        received = dict(zip([n for n, _ in body_specs], validate_arrays(content.array_records.get(ARRAYS), body_specs)))
        model = self.new_model()
        names = [name for name, _ in layout.specs]
        set_arrays(model, [received.get(name, value) for name, value in zip(names, get_arrays(model))])
        return model, [name for name, _ in body_specs]

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Train the body for `local-epochs` (the head frozen), upload the body."""
        model, body = self.model_with_body(content)
        before = self.snapshot(model)
        trainable = {name for name, _ in model.named_parameters() if name.startswith("body.")}
        stats = self.train_locally(model, server_round, trainable=trainable)
        reply = self.train_reply(
            stats,
            None,
            stages={"G": before, "L1": before, "L2": model},
            flops=self.train_flops(stats, trainable=trainable),
        )
        named = dict(zip([name for name, _ in self.layout().specs], get_arrays(model)))
        reply[ARRAYS] = to_record(body, [named[name] for name in body])
        return reply

    def newcomer_model(self, content: RecordDict) -> SplitModel:
        """The received body on the common initialization's head."""
        return self.model_with_body(content)[0]

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """The fine-tuned copy (main accuracy) and the received body with the initial head ('global-' row)."""
        params = self.cfg.params_as(FedBABUParams)
        model, _ = self.model_with_body(content)
        global_row = self.row(GLOBAL, model)
        trainable = None
        if params.fedbabu_finetune_part == "head":
            trainable = {name for name, _ in model.named_parameters() if name.startswith("head.")}
        settings = dataclasses.replace(self.settings(server_round), epochs=params.fedbabu_finetune_epochs)
        self.train_locally(model, server_round, "finetune", settings=settings, trainable=trainable)
        return self.eval_reply(self.evaluate_model(model), global_row)
