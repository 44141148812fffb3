"""FedFomo client half: weight the received peer models by validation-loss improvement, then train locally."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import RecordDict
from torch.nn import functional as F

from common.algorithms import FedFomoParams
from common.learning.evaluate import predict_logits
from common.learning.models import array_specs, get_arrays, set_arrays
from common.learning.train import train
from common.methods.fomo import WEIGHT_KEY, fomo_combine, fomo_weights
from common.seeding import derive_seed
from common.wire.messages import METRICS
from common.wire.validation import validate_arrays

from .local import PERSONAL, LocalClient

MAX_PEERS = 64


class FedFomoClient(LocalClient):
    """Holds out `fomo-val-fraction` of its training data to score peers; keeps its personal model."""

    def split(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Seeded (train, validation) index split of this client's training data."""
        n = self.env.data.num_train
        order = torch.randperm(
            n, generator=torch.Generator().manual_seed(derive_seed(self.cfg.seed, "fomo-val", self.env.partition_id))
        )
        n_val = max(1, int(round(self.cfg.params_as(FedFomoParams).fomo_val_fraction * n))) if n > 1 else 0
        return order[n_val:], order[:n_val]

    def val_loss(self, model: torch.nn.Module, val: torch.Tensor) -> float:
        """Cross-entropy of `model` on the validation samples."""
        data = self.env.data
        logits = predict_logits(model, data.train_x[val], device=self.env.device)
        return float(F.cross_entropy(logits, data.train_y[val]))

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Combine own and peer models by validation gain, train on the non-validation part, upload."""
        model = self.personal_model()
        specs = array_specs(model)
        peers = [
            validate_arrays(content.array_records[f"peer-{k}"], specs)
            for k in range(MAX_PEERS)
            if f"peer-{k}" in content.array_records
        ]
        train_idx, val_idx = self.split()
        weights: list[float] = []
        if peers and len(val_idx):
            own = get_arrays(model)
            own_loss = self.val_loss(model, val_idx)
            probe = self.new_model()
            losses, distances = [], []
            for arrays in peers:
                set_arrays(probe, arrays)
                losses.append(self.val_loss(probe, val_idx))
                distances.append(
                    float(np.sqrt(sum(np.sum((a.astype(np.float64) - b) ** 2) for a, b in zip(arrays, own))))
                )
            weights = fomo_weights(own_loss, losses, distances)
            set_arrays(model, fomo_combine(own, peers, weights))
        elif peers:
            weights = [0.0] * len(peers)
        before = self.snapshot(model)
        data = self.env.data
        stats = train(
            model,
            data.train_x[train_idx],
            data.train_y[train_idx],
            self.settings(server_round),
            self.generator(server_round),
            device=self.env.device,
        )
        self.env.state.save_arrays(PERSONAL, get_arrays(model))
        reply = self.train_reply(stats, model, stages={"L1": before, "L2": model})
        for k, w in enumerate(weights):
            reply.metric_records[METRICS][WEIGHT_KEY.format(k)] = w
        return reply
