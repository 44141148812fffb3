"""What the server keeps of a round: validated training replies, the round's counters, and evaluation statistics."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import RecordDict

from common.aggregate import mean_std
from common.evaluate import shift_key
from common.stages import STAGE_KEYS
from common.validation import read_count, read_finite, read_fraction

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


def parse_train_metrics(partition_id: int, content: RecordDict) -> TrainReply:
    """The metrics every training reply carries (PayloadError when they are missing or malformed)."""
    metrics = content.metric_records.get("metrics")
    reply = TrainReply(partition_id, read_count(metrics, "num-examples"), read_finite(metrics, "train-loss"), content)
    if metrics is not None:
        reply.stages = {key: read_fraction(metrics, key) for key in STAGE_KEYS if key in metrics}
    return reply


def reply_flops(content: RecordDict) -> float:
    """A reply's reported training FLOPs (0 when absent or malformed: a cost figure, never used in math)."""
    metrics = content.metric_records.get("metrics")
    value = metrics.get("train-flops", 0.0) if metrics is not None else 0.0
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) and value >= 0 else 0.0


@dataclass
class RoundLog:
    """Counters of one round, filled as it goes."""

    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROUND_BYTES, 0))
    per_client_bytes: dict[int, dict[str, int]] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] | None = None

    def add_bytes(self, kind: str, partition_id: int, num_bytes: int) -> None:
        """Count bytes of one message, in total and for its client."""
        self.bytes[kind] += num_bytes
        per = self.per_client_bytes.setdefault(partition_id, {"down": 0, "up": 0})
        per["down" if kind.endswith("down") else "up"] += num_bytes


def parse_eval_metrics(metrics: Mapping[str, Any] | None, degrees: tuple[float, ...],
                       extra: Callable[[Mapping[str, Any] | None], dict[str, float]]) -> dict[str, float]:
    """One client's evaluation row: accuracy at every shift degree, loss, and the algorithm's `extra` rows
    (PayloadError when any is missing or out of range)."""
    read_count(metrics, "num-test")
    row = {shift_key(d): read_fraction(metrics, shift_key(d)) for d in degrees}
    row["loss"] = read_finite(metrics, "loss")
    row.update(extra(metrics))
    return row


def eval_statistics(per_client: dict[int, dict[str, float]], failed: int) -> dict[str, Any]:
    """Mean and std across clients of every evaluation metric, with the per-client rows."""
    names = sorted({name for row in per_client.values() for name in row})
    stats = {name: mean_std([row.get(name, float("nan")) for row in per_client.values()]) for name in names}
    return {"num_clients": len(per_client), "failed": failed,
            "mean": {name: s[0] for name, s in stats.items()}, "std": {name: s[1] for name, s in stats.items()},
            "per_client": {str(pid): row for pid, row in per_client.items()}}
