"""Base of every algorithm's client half: shared helpers for training, evaluation and replies."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from common import profiling
from common.algorithms import EvalRow
from common.config import RunConfig
from common.data.evalsets import corrupted_test, domain_tests
from common.data.federated import ClientData, pooled_test
from common.learning.evaluate import EvalResult, corruption_key, evaluate_client, shift_key
from common.learning.flops import LayerFlops, executed_per_sample, layer_parts, training_flops
from common.learning.models import ModelLayout, SplitModel, array_specs, build_model, get_arrays, model_layout
from common.learning.stages import accuracy, stage_metrics
from common.learning.train import TrainSettings, TrainStats, train
from common.seeding import derive_seed
from common.wire.messages import (
    ARRAYS,
    CONFIG,
    DOMAIN_ACC,
    DOMAIN_ID,
    LOSS,
    LR_STEP,
    METRICS,
    NUM_EXAMPLES,
    NUM_TEST,
    PROX_MU,
    STEPS,
    TRAIN_FLOPS,
    TRAIN_FLOPS_DENSE_GRAD,
    TRAIN_LOSS,
)
from common.wire.payload_memo import PayloadMemo
from common.wire.records import to_record
from common.wire.validation import PayloadError, read_count, read_finite, validate_arrays

from ..privacy import private_reply
from ..state import ClientState

MetricValues = dict[str, int | float | list[int] | list[float]]  # what a MetricRecord holds


@dataclass
class ClientEnv:
    """Everything a client half works with: config, its data, its persistent state, the device."""

    cfg: RunConfig
    data: ClientData
    state: ClientState
    device: torch.device

    @property
    def partition_id(self) -> int:
        """This client's partition."""
        return self.data.partition_id


class ClientAlgorithm(ABC):
    """Client half of an algorithm: `fit` answers a train message, `evaluate` an evaluate message."""

    def __init__(self, env: ClientEnv) -> None:
        self.env = env
        self.cfg = env.cfg
        self.lr_step: int | None = None  # the message's 'lr-step' (lr-decay-step client), read by `receive`

    def receive(self, content: RecordDict) -> None:
        """Read what every handler needs from a message before it runs (the client's lr step)."""
        config = content.config_records.get(CONFIG)
        if config is not None and LR_STEP in config:
            self.lr_step = read_count(config, LR_STEP, allow_zero=True)

    # ----- helpers -------------------------------------------------------------------------------
    def new_model(self, arrays: Sequence[np.ndarray] | None = None) -> SplitModel:
        """The model at the run's common initialization (the same as the server's), or holding `arrays`."""
        data = self.env.data
        return build_model(
            self.cfg.model,
            self.cfg.dataset,
            data.input_shape,
            data.num_classes,
            derive_seed(self.cfg.seed, "model"),
            arrays,
        )

    def layout(self) -> ModelLayout:
        """Names, shapes and layer roles of that model (made once per process)."""
        data = self.env.data
        return model_layout(
            self.cfg.model,
            self.cfg.dataset,
            tuple(data.input_shape),
            data.num_classes,
            derive_seed(self.cfg.seed, "model"),
        )

    @staticmethod
    def instructions(content: RecordDict) -> ConfigRecord:
        """The round's instructions the server sent (its 'config' record)."""
        if CONFIG not in content.config_records:
            raise PayloadError("message has no 'config' record")
        return content.config_records[CONFIG]

    def proximal_mu(self, content: RecordDict) -> float:
        """The proximal coefficient the server sent ('prox-mu'): finite and >= 0."""
        mu = read_finite(self.instructions(content), PROX_MU)
        if mu < 0.0:
            raise PayloadError(f"prox-mu must be a finite non-negative number, got {mu}")
        return mu

    @profiling.timed("decode")
    def received_model(self, content: RecordDict, key: str = ARRAYS) -> SplitModel:
        """A model holding the arrays the server sent (validated like any received payload)."""
        return self.new_model(validate_arrays(content.array_records.get(key), self.layout().specs))

    def received_model_to_read(self, content: RecordDict, key: str = ARRAYS) -> SplitModel:
        """received_model for a caller that only evaluates it (never trains or changes it): the model is built once
        per payload in this process and shared by every client that gets the same one."""
        record = content.array_records.get(key)
        if record is None:
            return self.received_model(content, key)
        data = self.env.data
        params = (self.cfg.model, self.cfg.dataset, tuple(data.input_shape), data.num_classes)
        return _RECEIVED_MODELS.get(record, params, lambda: self.received_model(content, key))

    def settings(self, server_round: int) -> TrainSettings:
        """Local training settings of this round (lr decayed per round, or per past local training call of this
        client under `lr-decay-step` client)."""
        training = self.cfg.training
        if training.lr_decay_step == "client":
            if self.lr_step is None:
                raise PayloadError(f"lr-decay-step client: the message carries no '{LR_STEP}'")
            steps = self.lr_step
        else:
            steps = max(server_round - 1, 0)
        return TrainSettings(
            epochs=training.local_epochs,
            batch_size=training.batch_size,
            optimizer=training.optimizer,
            lr=training.lr_after(steps),
            momentum=training.momentum,
            weight_decay=training.weight_decay,
        )

    def generator(self, server_round: int, purpose: str = "train") -> torch.Generator:
        """Seeded generator for this client, round and purpose."""
        return torch.Generator().manual_seed(derive_seed(self.cfg.seed, purpose, self.env.partition_id, server_round))

    def train_locally(
        self,
        model: torch.nn.Module,
        server_round: int,
        purpose: str = "train",
        settings: TrainSettings | None = None,
        **options: Any,
    ) -> TrainStats:
        """The shared training loop on this client's training data, with this round's settings (or `settings`), the
        generator seeded by (round, `purpose`), on the client's device; `options` go to common.learning.train.train."""
        data = self.env.data
        chosen = settings if settings is not None else self.settings(server_round)
        generator = self.generator(server_round, purpose)
        return train(model, data.train_x, data.train_y, chosen, generator, device=self.env.device, **options)

    def evaluate_model(self, model: torch.nn.Module, shifted_sets: bool = True) -> EvalResult:
        """The shared evaluation loop on this client's test data at every shift degree and (unless `shifted_sets`
        is False: an extra row) under every configured corruption and on every domain's held-out data."""
        data = self.env.data
        corrupted: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        domains: tuple[tuple[str, torch.Tensor, torch.Tensor], ...] = ()
        if shifted_sets:
            corrupted = {
                corruption_key(name, severity): sets
                for (name, severity), sets in corrupted_test(
                    self.cfg.data, data.partition_id, data.num_partitions
                ).items()
            }
            domains = domain_tests(self.cfg.data, data.num_partitions)
        return evaluate_client(model, data, self.cfg.shift_degrees, self.env.device, corrupted, domains)

    @staticmethod
    @profiling.timed("encode")
    def model_record(model: torch.nn.Module) -> ArrayRecord:
        """A model's state as an ArrayRecord keyed by state-dict names."""
        return to_record([name for name, _ in array_specs(model)], get_arrays(model))

    @profiling.timed("flops")
    def train_flops(
        self,
        stats: TrainStats,
        active: dict[str, float] | None = None,
        trainable: set[str] | None = None,
        updated: dict[str, float] | None = None,
        dense_grad: bool = False,
        epochs: int | None = None,
    ) -> float:
        """FLOPs of the local training just done, as executed (common.learning.flops.executed_per_sample): forward and
        input gradients scaled by the layers' `active` densities, weight gradients by their `updated` densities (None:
        `active`) or whole under `dense_grad`; only `trainable` parameters (None: all) get gradients; `epochs` passes
        over the samples (None: the run's local epochs)."""
        data = self.env.data
        per_sample = _flops_per_sample(
            self.cfg.model,
            self.cfg.dataset,
            data.input_shape,
            data.num_classes,
            tuple(sorted((active or {}).items())),
            None if updated is None else tuple(sorted(updated.items())),
            None if trainable is None else tuple(sorted(trainable)),
            dense_grad,
        )
        passes = self.cfg.local_epochs if epochs is None else epochs
        return training_flops(per_sample, stats.num_samples, passes if stats.steps else 0)

    def forward_flops(self, stats: TrainStats, prefix: str = "") -> float:
        """FLOPs of forward passes without gradients over the samples of `stats`' training (as many epochs) through
        the layers whose weights start with `prefix` (e.g. 'body.': a model's feature extractor)."""
        data = self.env.data
        parts = _dense_parts(self.cfg.model, self.cfg.dataset, data.input_shape, data.num_classes)
        per_sample = executed_per_sample([part for part in parts if part.weight.startswith(prefix)], trainable=set())
        return training_flops(per_sample, stats.num_samples, self.cfg.local_epochs if stats.steps else 0)

    def stored_model(self, key: str, default: list[np.ndarray] | None = None) -> SplitModel:
        """A model holding the arrays kept in client state under `key`; on first use `default`, else the common
        initialization."""
        saved = self.env.state.load_arrays(key)
        return self.new_model(default if saved is None else saved)

    def snapshot(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """A copy of `model` for a later stage evaluation, when `stages` is on (None otherwise: no cost)."""
        return copy.deepcopy(model) if self.cfg.stages else None

    def stage_metrics(self, stages: Mapping[str, torch.nn.Module | None]) -> dict[str, float]:
        """Acc(L) and Acc(G) of the stage models (G, L1, L2) when `stages` is on; empty otherwise."""
        if not self.cfg.stages or not stages:
            return {}
        data = self.env.data
        pooled = pooled_test(self.cfg.data, data.num_partitions)
        return stage_metrics(stages, (data.test_x, data.test_y), pooled, self.env.device)

    def train_reply(
        self,
        stats: TrainStats,
        model: torch.nn.Module | None,
        active: dict[str, float] | None = None,
        stages: Mapping[str, torch.nn.Module | None] | None = None,
        flops: float | None = None,
        updated: dict[str, float] | None = None,
        trainable: set[str] | None = None,
    ) -> RecordDict:
        """Reply content of a training round: metrics (with FLOPs and stage accuracies), plus the model if uploaded.
        FLOPs of `stats` as train_flops counts them (weight gradients on `updated` positions only; with whole weight
        gradients too where that differs); `flops` replaces them when the client trained more than one model."""
        sparse = self.train_flops(stats, active, trainable, updated) if flops is None else flops
        dense = self.train_flops(stats, active, trainable, updated, dense_grad=True) if flops is None else flops
        metrics: MetricValues = {
            NUM_EXAMPLES: stats.num_samples,
            TRAIN_LOSS: _finite(stats.mean_loss),
            STEPS: stats.steps,
            TRAIN_FLOPS: sparse,
        }
        if dense != sparse:
            metrics[TRAIN_FLOPS_DENSE_GRAD] = dense
        metrics.update(self.stage_metrics(stages or {}))
        content = RecordDict({METRICS: MetricRecord(metrics)})
        if model is not None:
            content[ARRAYS] = self.model_record(model)
        return content

    def row(self, row: EvalRow, model: torch.nn.Module) -> dict[str, float]:
        """An extra evaluation row of the algorithm's spec: `model`'s accuracy at every shift degree."""
        return {
            row.prefix + shift_key(d): acc
            for d, acc in self.evaluate_model(model, shifted_sets=False).shift_accuracy.items()
        }

    def domain_metrics(self, model: torch.nn.Module) -> dict[str, float]:
        """Multi-domain data: `model`'s accuracy on the held-out test data of this client's domain (empty else)."""
        data = self.env.data
        if data.domain < 0 or data.domain_x is None or data.domain_y is None:
            return {}
        return {DOMAIN_ID: data.domain, DOMAIN_ACC: accuracy(model, data.domain_x, data.domain_y, self.env.device)}

    def eval_reply(self, result: EvalResult, extra: dict[str, float] | None = None) -> RecordDict:
        """Reply content of an evaluation: loss and accuracy at each shift degree, under each corruption and on each
        domain."""
        metrics: MetricValues = {NUM_TEST: result.num_test, LOSS: _finite(result.loss)}
        metrics.update({shift_key(d): acc for d, acc in result.shift_accuracy.items()})
        metrics.update(result.extra)
        metrics.update(extra or {})
        return RecordDict({METRICS: MetricRecord(metrics)})

    # ----- the two handlers ------------------------------------------------------------------------
    @abstractmethod
    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Answer a training message."""

    def private_reply(self, server_round: int, content: RecordDict, reply: RecordDict) -> RecordDict:
        """The training reply as it may leave the device: under `dp` = local its upload clipped and noised against
        the arrays the server sent (client_app/privacy.py); unchanged otherwise."""
        return private_reply(self.cfg.privacy, content, reply, self.env.partition_id, server_round)

    def newcomer_model(self, content: RecordDict) -> torch.nn.Module:
        """What a client that never trained evaluates and fine-tunes from the server's newcomer record (default: the
        model as received; an algorithm that sends part of the model fills the rest as a new client of it would)."""
        return self.received_model(content)

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """Answer an evaluation message (default: evaluate the model the server sent, also on its domain)."""
        model = self.received_model_to_read(content)
        return self.eval_reply(self.evaluate_model(model), self.domain_metrics(model))


# the model an evaluation round sends every client (FedAvg's global model): built once per worker process
_RECEIVED_MODELS: PayloadMemo[SplitModel] = PayloadMemo(size=1)


def _flops_per_sample(
    model_name: str,
    dataset: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    active: tuple[tuple[str, float], ...],
    updated: tuple[tuple[str, float], ...] | None = None,
    trainable: tuple[str, ...] | None = None,
    dense_grad: bool = False,
) -> float:
    """One sample's training FLOPs as executed: the dense model's per-layer parts (counted once per process) under
    the layers' densities (which change with every mask)."""
    parts = _dense_parts(model_name, dataset, input_shape, num_classes)
    return executed_per_sample(
        parts,
        dict(active),
        None if updated is None else dict(updated),
        None if trainable is None else set(trainable),
        dense_grad,
    )


@lru_cache(maxsize=32)
def _dense_parts(
    model_name: str, dataset: str, input_shape: tuple[int, ...], num_classes: int
) -> tuple[LayerFlops, ...]:
    model = build_model(model_name, dataset, input_shape, num_classes, seed=0)
    return layer_parts(model, input_shape, num_classes)


def _finite(value: float) -> float:
    return float(value) if np.isfinite(value) else 0.0
