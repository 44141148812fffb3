"""Held-out clients (run-config holdout-clients): evaluated as newcomers that never trained, as received and after
`holdout-finetune-epochs` of local fine-tuning; their statistics are the round's `unseen` row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import Message

from common.algorithms import FINETUNED
from common.learning.evaluate import shift_key, shifted_metric_keys
from common.sections import EvaluationSettings
from common.storage.run_folder import Evaluation
from common.wire.validation import read_fraction

from .replies import eval_statistics, evaluation_rows


def finetuned_metrics(metrics: Mapping[str, Any] | None, degrees: tuple[float, ...], epochs: int) -> dict[str, float]:
    """The fine-tuned accuracies a newcomer's reply must carry (none when no fine-tuning was asked for)."""
    if epochs <= 0:
        return {}
    return {FINETUNED.prefix + shift_key(d): read_fraction(metrics, FINETUNED.prefix + shift_key(d)) for d in degrees}


def newcomer_statistics(
    good: list[tuple[int, Message]], not_used: int, evaluation: EvaluationSettings
) -> Evaluation | None:
    """Mean and std of the held-out clients' replies (the round's `unseen` row; None when none was usable), each
    checked for the accuracies it must carry; `not_used`: replies already set aside (failed, oversized)."""
    rows, rejected = evaluation_rows(
        good,
        evaluation.shift_degrees,
        lambda m: finetuned_metrics(m, evaluation.shift_degrees, evaluation.holdout_finetune_epochs),
        "held-out client",
        required=shifted_metric_keys(evaluation),
    )
    return eval_statistics(rows, not_used + rejected) if rows else None
