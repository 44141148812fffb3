"""DapperFL client (DapperFL [arXiv:2412.05823] Alg. 1-2): fine-tune the global model one epoch,
fuse it with the global model, prune output channels by l1 to the device's ratio, train the physically smaller
model with the domain adaptive regularizer for the remaining epochs, upload it with its channel masks.

`dapperfl-variant = official` runs the authors' public code as it behaves instead (common/methods/dapperfl.py): the
fine-tuned model is pruned unfused, by the public code's layer-wise rules, as fixed zeros in the full-shape model,
which is trained with the DAR term ||z|| in every epoch and uploaded whole, zeros included.

Paper: Jia et al., "DapperFL: Domain Adaptive Federated Learning with Model Fusion Pruning for Edge Devices", NeurIPS
2024, arXiv:2412.05823."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict

from common.algorithms import GLOBAL, DapperFLParams
from common.learning.flops import flops_per_sample, training_flops
from common.learning.models import SplitModel, build_model, get_arrays, set_arrays
from common.learning.train import ExtraLoss, TrainStats, train
from common.methods.channels import channel_groups, entry_indices, pruned_model, take
from common.methods.dapperfl import OFFICIAL, dar_loss, fusion_factor, official_prune, pruning_input, select_channels
from common.wire.messages import ARRAYS, CHANNEL_MASKS
from common.wire.records import to_plain_record, to_record
from common.wire.validation import record_to_numpy

from ..privacy import private_weights
from .base import ClientAlgorithm

LOCAL = "dapperfl-local"  # the last pruned local model
MASKS = "dapperfl-masks"  # its channel masks


def mask_record(masks: list[np.ndarray]) -> ArrayRecord:
    """The channel masks as uint8 arrays named group-<i>."""
    return to_plain_record({f"group-{i}": m.astype(np.uint8) for i, m in enumerate(masks)})


class DapperFLClient(ClientAlgorithm):
    """Trains and uploads a model pruned to its device's ratio; evaluates that model and the global one.
    `paper`: physically smaller model and channel masks; `official`: the full-shape model with zeros."""

    def ratio(self) -> float:
        """This device's pruning ratio: the configured list cycled over partition ids."""
        ratios = self.cfg.params_as(DapperFLParams).dapperfl_ratios
        return ratios[self.env.partition_id % len(ratios)]

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Algorithm 1 (model fusion pruning, epoch 1), then epochs 2..E of CE + gamma ||z||^2 on the pruned model;
        `official`: the same steps as the public code runs them (module docstring)."""
        params = self.cfg.params_as(DapperFLParams)
        variant = params.dapperfl_variant
        data, device = self.env.data, self.env.device
        model = self.received_model(content)
        received = self.snapshot(model)
        settings = self.settings(server_round)
        extra = [dar_loss(params.dapperfl_gamma, variant)] if params.dapperfl_dar and params.dapperfl_gamma > 0 else []
        full_epochs = 0
        if params.dapperfl_mfp:
            global_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            train(
                model,
                data.train_x,
                data.train_y,
                replace(settings, epochs=1),
                self.generator(server_round, "mfp"),
                extra_losses=extra if variant == OFFICIAL else (),  # the public code's DAR runs from epoch 1
                device=device,
            )
            alpha = fusion_factor(
                server_round, params.dapperfl_alpha0, params.dapperfl_alpha_min, params.dapperfl_epsilon
            )
            model.load_state_dict(pruning_input(variant, global_state, model.state_dict(), alpha))
            full_epochs = 1
        if variant == OFFICIAL:
            return self.fit_official(server_round, model, received, extra, full_epochs)
        groups = channel_groups(model)
        masks = select_channels(dict(zip(model.state_dict(), get_arrays(model))), groups, self.ratio())
        small = pruned_model(model, groups, masks)
        stats = self.train_remaining(small, server_round, full_epochs, extra)
        self.env.state.save_arrays(LOCAL, get_arrays(small))
        self.env.state.save_arrays(MASKS, [m.astype(np.float32) for m in masks])
        flops = training_flops(
            self.flops_per_sample(tuple(g.size for g in groups)), data.num_train, full_epochs
        ) + training_flops(
            self.flops_per_sample(tuple(int(m.sum()) for m in masks)), data.num_train, settings.epochs - full_epochs
        )
        reply = self.train_reply(stats, small, stages={"G": received, "L1": received, "L2": small}, flops=flops)
        reply[CHANNEL_MASKS] = mask_record(masks)
        return reply

    def fit_official(
        self,
        server_round: int,
        model: torch.nn.Module,
        received: torch.nn.Module | None,
        extra: list[ExtraLoss],
        full_epochs: int,
    ) -> RecordDict:
        """The public code's pruning as zeros in the full-shape model, held there by update masks over the remaining
        epochs; the whole model uploaded, zeros included (no channel masks)."""
        data, settings = self.env.data, self.settings(server_round)
        stats = self.train_remaining(model, server_round, full_epochs, extra, official_prune(model, self.ratio()))
        self.env.state.save_arrays(LOCAL, get_arrays(model))
        # zeros in a full-shape model save no computation: every epoch costs what the unpruned model costs
        dense = self.flops_per_sample(tuple(g.size for g in channel_groups(model)))
        flops = training_flops(dense, data.num_train, settings.epochs)
        return self.train_reply(stats, model, stages={"G": received, "L1": received, "L2": model}, flops=flops)

    def train_remaining(
        self,
        model: torch.nn.Module,
        server_round: int,
        full_epochs: int,
        extra: list[ExtraLoss],
        update_masks: dict[str, torch.Tensor] | None = None,
    ) -> TrainStats:
        """The epochs after the fusion-pruning epoch (all of them without MFP), with the DAR term."""
        settings = self.settings(server_round)
        return train(
            model,
            self.env.data.train_x,
            self.env.data.train_y,
            replace(settings, epochs=settings.epochs - full_epochs),
            self.generator(server_round),
            update_masks=update_masks,
            extra_losses=extra,
            device=self.env.device,
        )

    def private_reply(self, server_round: int, content: RecordDict, reply: RecordDict) -> RecordDict:
        """Under `dp` = local, the paper variant's pruned upload: its update against the received global model cut
        to the same channels (what the server recovers it against, Eq. 6: 0 on every pruned entry, so this is the
        norm the server's update has) clipped to `dp-clip-norm` and noised on every entry it sends; the official
        variant's full-shape upload as any algorithm's."""
        if self.cfg.privacy.dp != "local" or CHANNEL_MASKS not in reply.array_records:
            return super().private_reply(server_round, content, reply)
        groups = self.layout().channels
        flags = record_to_numpy(reply.array_records[CHANNEL_MASKS])
        masks = [flags[f"group-{i}"] > 0 for i in range(len(groups))]
        received = record_to_numpy(content.array_records[ARRAYS])
        sent = record_to_numpy(reply.array_records[ARRAYS])
        indices = entry_indices(groups, masks, [(name, a.shape) for name, a in received.items()])
        reference = {name: take(received[name], indices.get(name, {})) for name in sent}
        noised = private_weights(
            self.cfg.privacy, reference, sent, dict.fromkeys(sent), self.env.partition_id, server_round
        )
        reply[ARRAYS] = to_record(list(sent), [noised[name] for name in sent])
        return reply

    def flops_per_sample(self, kept: tuple[int, ...]) -> float:
        """Training FLOPs of one sample for the model keeping `kept` channels of each group (cached)."""
        data = self.env.data
        return _pruned_flops(self.cfg.model, self.cfg.dataset, data.input_shape, data.num_classes, kept)

    def local_model(self) -> torch.nn.Module | None:
        """The pruned model this client trained last (None before its first round)."""
        arrays = self.env.state.load_arrays(LOCAL)
        if arrays is not None and self.cfg.params_as(DapperFLParams).dapperfl_variant == OFFICIAL:
            return self.new_model(arrays)  # full shape, pruned entries 0
        masks = self.env.state.load_arrays(MASKS)
        if arrays is None or masks is None:
            return None
        base: SplitModel = self.new_model()
        small = pruned_model(base, channel_groups(base), [m > 0.5 for m in masks])
        set_arrays(small, arrays)
        return small

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """The client's own pruned model on its test split (the global model before it has one), and the global."""
        received = self.received_model_to_read(content)
        local = self.local_model()
        extra = {**self.row(GLOBAL, received), **self.domain_metrics(received)}
        return self.eval_reply(self.evaluate_model(local if local is not None else received), extra)


@lru_cache(maxsize=64)
def _pruned_flops(
    model_name: str, dataset: str, input_shape: tuple[int, ...], num_classes: int, kept: tuple[int, ...]
) -> float:
    # counted on a fresh model: a forward pass of the trained one would move its batch-norm statistics
    model = build_model(model_name, dataset, input_shape, num_classes, seed=0)
    groups = channel_groups(model)
    masks = [np.arange(group.size) < count for group, count in zip(groups, kept, strict=True)]
    return flops_per_sample(pruned_model(model, groups, masks), input_shape, num_classes)
