"""Held-out clients (run-config holdout-clients): evaluated as newcomers that never trained, as received and after
`holdout-finetune-epochs` of local fine-tuning; their statistics are the round's `unseen` row."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import MessageType
from flwr.serverapp import Grid

from common.algorithms import FINETUNED
from common.evaluate import shift_key, shifted_metric_keys
from common.validation import read_fraction

from .exchange import RunnerView, exchange_all
from .replies import eval_statistics, evaluation_rows


def finetuned_metrics(metrics: Mapping[str, Any] | None, degrees: tuple[float, ...], epochs: int) -> dict[str, float]:
    """The fine-tuned accuracies a newcomer's reply must carry (none when no fine-tuning was asked for)."""
    if epochs <= 0:
        return {}
    return {FINETUNED.prefix + shift_key(d): read_fraction(metrics, FINETUNED.prefix + shift_key(d)) for d in degrees}


def evaluate_newcomers(runner: RunnerView, grid: Grid, server_round: int) -> None:
    """Send every held-out client the newcomer model; keep the mean and std of their replies as `unseen`."""
    cfg = runner.cfg
    pids = runner.clients.holdout_ids()
    if not pids:
        return
    replies = exchange_all(runner, grid, server_round, pids, MessageType.EVALUATE, "eval_down", newcomers=True)
    good, failed, oversized = runner.sort_replies(server_round, replies, "eval_up")
    rows, rejected = evaluation_rows(
        good,
        cfg.shift_degrees,
        lambda m: finetuned_metrics(m, cfg.shift_degrees, cfg.holdout_finetune_epochs),
        "held-out client",
        required=shifted_metric_keys(cfg),
    )
    runner.round_log.unseen = eval_statistics(rows, failed + oversized + rejected) if rows else None
