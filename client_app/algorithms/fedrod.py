"""FedRoD's client half: the received generic model (body and generic head) trained with the balanced softmax and
uploaded for FedAvg's average; a personalized head, kept on the device, trained on the same features with the
generic logits held fixed; evaluation reports generic + personalized logits, the generic model as its 'global-' row
(Chen, Chao, "On Bridging Generic and Personalized Federated Learning for Image Classification", ICLR 2022)."""

from __future__ import annotations

import torch
from flwr.app import RecordDict

from common.algorithms import GLOBAL
from common.learning.models import SplitModel, get_arrays, set_arrays
from common.methods.fedrod import RoDModel, rod_loss

from .base import ClientAlgorithm

PERSONAL_HEAD = "fedrod/personal-head"  # the personalized head's arrays (its state-dict order)


class FedRoDClient(ClientAlgorithm):
    """One pass of the training loop trains both heads (their gradients do not mix: common/methods/fedrod.py)."""

    def with_personal_head(self, generic: SplitModel) -> RoDModel:
        """`generic` beside this client's personalized head (before its first training: the common
        initialization's head, as PFLlib)."""
        head = self.new_model().head
        saved = self.env.state.load_arrays(PERSONAL_HEAD)
        if saved is not None:
            set_arrays(head, saved)
        return RoDModel(generic, head)

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Train the generic model and the personalized head for `local-epochs`, keep the head, upload the model."""
        generic = self.received_model(content)
        received = self.snapshot(generic)
        model = self.with_personal_head(generic)
        before = self.snapshot(model)
        data = self.env.data
        counts = torch.bincount(data.train_y.long(), minlength=data.num_classes)
        stats = self.train_locally(model, server_round, batch_loss=rod_loss(counts))
        self.env.state.save_arrays(PERSONAL_HEAD, get_arrays(model.personal_head))
        # the personalized head: a forward pass and its weight gradient on every sample (no input gradient)
        flops = self.train_flops(stats) + 2 * self.forward_flops(stats, "head.")
        return self.train_reply(stats, generic, stages={"G": received, "L1": before, "L2": model}, flops=flops)

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """Generic + personalized logits (main accuracy) and the generic model ('global-' row)."""
        generic = self.received_model_to_read(content)
        global_row = self.row(GLOBAL, generic)
        return self.eval_reply(self.evaluate_model(self.with_personal_head(generic)), global_row)
