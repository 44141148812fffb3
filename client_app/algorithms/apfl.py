"""APFL client half (Deng et al., 2020): a local copy of the global model w, a personal model v and a mixing weight
alpha; the personalized model is alpha * v + (1 - alpha) * w. v and alpha stay on the device.

Paper: Zhang, Zhou, Wang, Tong, "DM-PFL: Hitchhiking Generic Federated Learning for Efficient Shift-Robust
Personalization", KDD 2023, doi:10.1145/3580305.3599311 (not on arXiv)."""

from __future__ import annotations

import numpy as np
from flwr.app import RecordDict
from torch import nn

from common.algorithms import GLOBAL, APFLParams
from common.models import SplitModel, get_arrays
from common.personal import Mixture, mixture_arrays

from .base import ClientAlgorithm
from .local import PERSONAL

ALPHA = "apfl/alpha"


class APFLClient(ClientAlgorithm):
    """`local-epochs` on w (uploaded, as FedAvg), then as many on v and alpha through the mixture with the received
    global model held fixed: the mixture a client evaluates. APFL interleaves the two updates step by step and mixes
    with the local w as it trains; running them one after the other through the shared training loop keeps one loop
    for every algorithm and the same number of steps (DM-PFL paper, A.1.4), and mixing with a w already fitted to the
    local data would teach alpha to trust that w (it fell to 0 in a check), not the global model used at inference."""

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
        """Train w, then v and alpha on the mixture with that w; keep v and alpha, upload w."""
        w = self.received_model(content)
        received = self.snapshot(w)
        v = self.stored_model(PERSONAL, default=get_arrays(w))
        alpha = self.alpha()
        before = self.mixed(v, w, alpha) if self.cfg.stages else None
        mixture = Mixture(v, dict(w.named_parameters()), alpha)  # holds a copy of the received w
        global_stats = self.train_locally(w, server_round)
        personal_stats = self.train_locally(mixture, server_round, "personal")
        alpha = mixture.clamped_alpha()
        self.env.state.save_arrays(PERSONAL, get_arrays(v))
        self.env.state.save_named(ALPHA, {"alpha": np.array([alpha], np.float64)})
        after = self.mixed(v, received, alpha) if received is not None else None
        flops = self.train_flops(global_stats) + self.train_flops(personal_stats)
        return self.train_reply(global_stats, w, stages={"G": received, "L1": before, "L2": after}, flops=flops)

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """The personalized mixture with the current global model (main accuracy) and that global model."""
        w = self.received_model(content)
        v = self.stored_model(PERSONAL, default=get_arrays(w))
        return self.eval_reply(self.evaluate_model(self.mixed(v, w, self.alpha())), self.row(GLOBAL, w))
