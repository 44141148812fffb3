"""Per-FedAvg's client half: local meta steps on the received model (each reads two mini-batches, three for the
Hessian-free variant), uploaded for FedAvg's average; to evaluate, one step of size alpha on one mini-batch of the
client's training data (Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical Guarantees: A
Model-Agnostic Meta-Learning Approach", NeurIPS 2020, Algorithm 1 and Sec. 5)."""

from __future__ import annotations

import dataclasses

import torch
from flwr.app import RecordDict

from common.algorithms import GLOBAL, PerFedAvgParams
from common.learning.train import TrainSettings, train
from common.methods.perfedavg import batches_per_step, meta_loss

from .base import ClientAlgorithm


class PerFedAvgClient(ClientAlgorithm):
    """Meta-trains the received model for `local-epochs` (outer step: the run's lr and optimizer; inner: plain SGD
    of size alpha), uploads it; evaluates it after one personal step (main accuracy) and as received ('global-')."""

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Meta steps over batches of parts x batch-size samples, split into D, D' (and D'')."""
        params = self.cfg.params_as(PerFedAvgParams)
        model = self.received_model(content)
        received = self.snapshot(model)
        parts = batches_per_step(params.perfedavg_variant)
        settings = self.settings(server_round)
        meta = dataclasses.replace(settings, batch_size=settings.batch_size * parts)
        stats = self.train_locally(
            model, server_round, settings=meta, batch_loss=meta_loss(params.perfedavg_alpha, params.perfedavg_variant)
        )
        # every sample takes one forward and backward pass (3 forward-pass units); D'' (a third of them) also a
        # backward through its gradient's graph, counted as two more backward passes (4 units): 13/9 of that in all
        flops = self.train_flops(stats) * (13 / 9 if params.perfedavg_variant == "hf" else 1.0)
        return self.train_reply(stats, model, stages={"G": received, "L1": received, "L2": model}, flops=flops)

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """One SGD step of size alpha on a seeded mini-batch of the training data, then the evaluation."""
        params = self.cfg.params_as(PerFedAvgParams)
        model = self.received_model(content)
        global_row = self.row(GLOBAL, model)
        data = self.env.data
        generator = self.generator(server_round, "personal-step")
        chosen = torch.randperm(len(data.train_y), generator=generator)[: self.cfg.training.batch_size]
        step = TrainSettings(epochs=1, batch_size=len(chosen), lr=params.perfedavg_alpha)
        train(model, data.train_x[chosen], data.train_y[chosen], step, generator, device=self.env.device)
        return self.eval_reply(self.evaluate_model(model), global_row)
