"""What the server keeps of a round: validated training replies, the round's counters, and evaluation statistics."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict
from flwr.supercore import log

from common.data.domains import DOMAINS
from common.learning.evaluate import shift_key
from common.learning.stages import STAGE_KEYS, summarize_stages
from common.methods.aggregate import mean_std
from common.storage.run_folder import Evaluation
from common.wire.messages import (
    DOMAIN_ACC,
    DOMAIN_ID,
    LOSS,
    METRICS,
    NUM_EXAMPLES,
    NUM_TEST,
    TRAIN_FLOPS,
    TRAIN_FLOPS_DENSE_GRAD,
    TRAIN_LOSS,
)
from common.wire.validation import PayloadError, read_count, read_finite, read_fraction

from .wire import content_digest, wire_bytes

ROUND_BYTES = ("train_down", "train_up", "eval_down", "eval_up")


@dataclass
class TrainReply:
    """A validated training reply; the strategy fills `arrays` or `payload` with what it decoded."""

    partition_id: int
    num_examples: int
    loss: float
    content: RecordDict
    arrays: list[np.ndarray] | None = None
    payload: Any = None  # algorithm-specific decoded upload (e.g. sparse weights and masks)
    stages: dict[str, float] = field(default_factory=dict)  # FLIU stage accuracies, when reported
    weight_cap: float = math.inf  # the most this reply counts in a weighted average (run-config max-weight-ratio)

    @property
    def weight(self) -> float:
        """The reply's weight in every sample-weighted average: its sample count, at most `weight_cap`."""
        return float(min(self.num_examples, self.weight_cap))


def parse_train_metrics(
    partition_id: int, content: RecordDict, declared: int, weight_cap: float = math.inf
) -> TrainReply:
    """The metrics every training reply carries (PayloadError when they are missing or malformed, or when the
    sample count exceeds the `declared` training samples of the client's handshake); its weight at most
    `weight_cap`."""
    metrics = content.metric_records.get(METRICS)
    reply = TrainReply(
        partition_id,
        read_count(metrics, NUM_EXAMPLES),
        read_finite(metrics, TRAIN_LOSS),
        content,
        weight_cap=weight_cap,
    )
    if reply.num_examples > declared:
        raise PayloadError(
            f"num-examples = {reply.num_examples} exceeds the {declared} training samples the client "
            "declared at the handshake"
        )
    if metrics is not None:
        reply.stages = {key: read_fraction(metrics, key) for key in STAGE_KEYS if key in metrics}
    return reply


def train_record(
    accepted: list[TrainReply], failed: int, rejected: int, so_far: Mapping[str, Any], rho_eps: tuple[float, ...]
) -> dict[str, Any]:
    """A training round's record: replies received (each one of used, failed, rejected or late, `so_far` holding the
    late ones and the pre-training's FLOPs), mean loss, samples, FLOPs (also with whole weight gradients), the
    clients used, their stages."""
    total = sum(r.num_examples for r in accepted)
    pretrain = so_far.get("pretrain", {}).get("flops", 0.0)
    record: dict[str, Any] = {
        "received": len(accepted) + failed + rejected + so_far.get("late", 0),
        "failed": failed,
        "rejected": rejected,
        "used": len(accepted),
        "loss": sum(r.loss * r.num_examples for r in accepted) / total if total else float("nan"),
        "num_examples": total,
        "flops": sum(reply_flops(r.content) for r in accepted) + pretrain,
        "flops_dense_grad": sum(reply_flops(r.content, dense_grad=True) for r in accepted) + pretrain,
        "clients": [r.partition_id for r in accepted],
    }
    if stage_rows := [r.stages for r in accepted if r.stages]:
        record["stages"] = summarize_stages(stage_rows, rho_eps)
    return record


def reply_flops(content: RecordDict, dense_grad: bool = False) -> float:
    """A reply's reported training FLOPs (0 when absent or malformed: a cost figure, never used in math);
    `dense_grad`: those with whole weight gradients, which a reply sends only where they differ (else train-flops)."""
    metrics = content.metric_records.get(METRICS)
    if metrics is None:
        return 0.0
    key = TRAIN_FLOPS_DENSE_GRAD if dense_grad and TRAIN_FLOPS_DENSE_GRAD in metrics else TRAIN_FLOPS
    value = metrics.get(key, 0.0)
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) and value >= 0 else 0.0


@dataclass
class RoundLog:
    """Counters of one round, filled as it goes."""

    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROUND_BYTES, 0))
    per_client_bytes: dict[int, dict[str, int]] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    eval: Evaluation | None = None
    unseen: Evaluation | None = None  # the held-out clients' evaluation (newcomers), when the run has them
    aggregate_s: float | None = None  # server time of the round's aggregation
    evaluate_s: float | None = None  # wall time of the round's evaluation (every client asked, replies checked)
    digests: list[dict[str, Any]] | None = None  # run-config message-digests: one entry per message (else None)
    timed_out: dict[str, int] = field(default_factory=dict)  # messages given up unanswered (round-timeout), by
    # what they were sent as: train_down, eval_down, eval_down/newcomers

    @classmethod
    def starting(cls, keep_digests: bool) -> RoundLog:
        """Empty counters for a round, with a list for the messages' digests when the run keeps them."""
        return cls(digests=[] if keep_digests else None)

    def add_bytes(self, kind: str, partition_id: int, num_bytes: int) -> None:
        """Count bytes of one message, in total and for its client."""
        self.bytes[kind] += num_bytes
        per = self.per_client_bytes.setdefault(partition_id, {"down": 0, "up": 0})
        per["down" if kind.endswith("down") else "up"] += num_bytes

    def add_timed_out(self, sent_as: str, count: int) -> None:
        """Count messages given up unanswered after the round timeout."""
        self.timed_out[sent_as] = self.timed_out.get(sent_as, 0) + count

    def add_message(self, kind: str, partition_id: int, message: Message, num_bytes: int | None = None) -> None:
        """Count a message's bytes (its serialized size unless given) and keep its digest when digests are kept."""
        self.add_bytes(kind, partition_id, wire_bytes(message) if num_bytes is None else num_bytes)
        if self.digests is not None:
            self.digests.append({"kind": kind, "client": partition_id, "digest": content_digest(message)})


def parse_eval_metrics(
    metrics: Mapping[str, Any] | None,
    degrees: tuple[float, ...],
    extra: Callable[[Mapping[str, Any] | None], dict[str, float]],
    required: Sequence[str] = (),
) -> dict[str, float]:
    """One client's evaluation row: accuracy at every shift degree, loss, the `required` accuracies (the run's
    corruptions and domains, common.learning.evaluate.shifted_metric_keys) and the algorithm's `extra` rows
    (PayloadError when any is missing or out of range; metrics nobody asked for are ignored)."""
    read_count(metrics, NUM_TEST)
    row = {shift_key(d): read_fraction(metrics, shift_key(d)) for d in degrees}
    row[LOSS] = read_finite(metrics, LOSS)
    row.update({key: read_fraction(metrics, key) for key in required})
    row.update(extra(metrics))
    if metrics is not None and DOMAIN_ID in metrics:  # multi-domain data: the global model on the client's domain
        domain = read_count(metrics, DOMAIN_ID, allow_zero=True)
        if domain >= len(DOMAINS):
            raise PayloadError(f"metric 'domain-id' = {domain} names no domain")
        row[domain_key(DOMAINS[domain])] = read_fraction(metrics, DOMAIN_ACC)
    return row


def evaluation_rows(
    good: list[tuple[int, Message]],
    degrees: tuple[float, ...],
    extra: Callable[[Mapping[str, Any] | None], dict[str, float]],
    who: str = "client",
    required: Sequence[str] = (),
) -> tuple[dict[int, dict[str, float]], int]:
    """Each good evaluation reply's row (parse_eval_metrics), and how many were rejected (each logged)."""
    rows: dict[int, dict[str, float]] = {}
    rejected = 0
    for pid, msg in good:
        try:
            rows[pid] = parse_eval_metrics(msg.content.metric_records.get(METRICS), degrees, extra, required)
        except PayloadError as exc:
            log(WARNING, "%s %d: evaluation reply rejected: %s", who, pid, exc)
            rejected += 1
    return rows, rejected


def domain_key(name: str) -> str:
    """The evaluation row of the global model's accuracy on one domain's held-out test data."""
    return f"domain-{name}-acc"


def eval_statistics(per_client: dict[int, dict[str, float]], failed: int) -> Evaluation:
    """Mean and std across clients of every evaluation metric, with the per-client rows."""
    names = sorted({name for row in per_client.values() for name in row})
    stats = {name: mean_std([row.get(name, float("nan")) for row in per_client.values()]) for name in names}
    return Evaluation(
        num_clients=len(per_client),
        failed=failed,
        mean={name: s[0] for name, s in stats.items()},
        std={name: s[1] for name, s in stats.items()},
        per_client={str(pid): row for pid, row in per_client.items()},
    )
