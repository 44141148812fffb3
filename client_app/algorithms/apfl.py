"""APFL client half: a local copy of the global model w, a personal model v and a mixing weight alpha; the
personalized model is alpha * v + (1 - alpha) * w. v and alpha stay on the device.

Paper: Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", arXiv:2003.13461 (Algorithm 1)."""

from __future__ import annotations

import dataclasses

import numpy as np
from flwr.app import RecordDict
from torch import nn

from common.algorithms import GLOBAL, APFLParams
from common.learning.models import SplitModel, get_arrays
from common.methods.personal import InterleavedMixture, mixture_arrays

from .base import ClientAlgorithm
from .local import PERSONAL

ALPHA = "apfl/alpha"


class APFLClient(ClientAlgorithm):
    """APFL's Algorithm 1 for `local-epochs` passes over the local data: on every minibatch w takes a step on its own
    loss, and v and alpha a step on the loss of alpha * v + (1 - alpha) * w built from that step's w (its values, no
    gradient into w), all from the same point; alpha is kept in [0, 1]. w is uploaded (as FedAvg), v and alpha stay.
    The client evaluates the mixture of its v with the received global model, as APFL does."""

    def alpha(self) -> float:
        """The stored alpha, or `apfl-alpha` on first contact."""
        saved = self.env.state.load_named(ALPHA)
        return float(saved["alpha"][0]) if saved else self.cfg.params_as(APFLParams).apfl_alpha

    def mixed(self, v: nn.Module, w: nn.Module, alpha: float) -> SplitModel:
        """alpha * v + (1 - alpha) * w on the parameters, v's buffers (e.g. batch-norm statistics)."""
        params = {name for name, _ in v.named_parameters()}
        flags = [name in params for name in v.state_dict()]
        return self.new_model(mixture_arrays(get_arrays(v), get_arrays(w), alpha, flags))

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Train w, v and alpha together, step by step; keep v and alpha, upload w."""
        w = self.received_model(content)
        received = self.snapshot(w)
        v = self.stored_model(PERSONAL, default=get_arrays(w))
        alpha = self.alpha()
        before = self.mixed(v, w, alpha) if self.cfg.stages else None
        step = InterleavedMixture(w, v, alpha)
        stats = self.train_locally(step, server_round, extra_losses=[step.mixture_loss])
        alpha = step.clamped_alpha()
        self.env.state.save_arrays(PERSONAL, get_arrays(v))
        self.env.state.save_named(ALPHA, {"alpha": np.array([alpha], np.float64)})
        after = self.mixed(v, received, alpha) if received is not None else None
        # every step runs w's forward and backward pass and the mixture's (its mixing is elementwise work, which the
        # FLOP count leaves out for every algorithm)
        flops = 2 * self.train_flops(stats)
        # the loop's loss sums both terms; the reported training loss is w's own, as FedAvg's
        local_stats = dataclasses.replace(stats, mean_loss=stats.mean_loss - step.mixture_mean_loss())
        return self.train_reply(local_stats, w, stages={"G": received, "L1": before, "L2": after}, flops=flops)

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """The personalized mixture with the current global model (main accuracy) and that global model."""
        w = self.received_model(content)
        v = self.stored_model(PERSONAL, default=get_arrays(w))
        return self.eval_reply(self.evaluate_model(self.mixed(v, w, self.alpha())), self.row(GLOBAL, w))
