"""Held-out clients (run-config holdout-clients): evaluated as newcomers that never trained, as received and after
`holdout-finetune-epochs` of local fine-tuning; their statistics are the round's `unseen` row."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from flwr.app import Message, MessageType
from flwr.serverapp import Grid

from common.algorithms import FINETUNED
from common.config import RunConfig
from common.evaluate import shift_key, shifted_metric_keys
from common.validation import read_fraction

from .clients import ClientRegistry
from .exchange import exchange_all
from .replies import RoundLog, eval_statistics, evaluation_rows


class Runner(Protocol):
    """What the newcomer evaluation uses of the round runner."""

    cfg: RunConfig
    clients: ClientRegistry
    round_log: RoundLog

    def messages(self, server_round: int, partition_ids: list[int], message_type: str, kind: str,
                 newcomers: bool = ...) -> list[Message]: ...

    def sort_replies(self, server_round: int, replies: Iterable[Message],
                     kind: str) -> tuple[list[tuple[int, Message]], int, int]: ...


def finetuned_metrics(metrics: Mapping[str, Any] | None, degrees: tuple[float, ...],
                      epochs: int) -> dict[str, float]:
    """The fine-tuned accuracies a newcomer's reply must carry (none when no fine-tuning was asked for)."""
    if epochs <= 0:
        return {}
    return {FINETUNED.prefix + shift_key(d): read_fraction(metrics, FINETUNED.prefix + shift_key(d)) for d in degrees}


def evaluate_newcomers(runner: Runner, grid: Grid, server_round: int) -> None:
    """Send every held-out client the newcomer model; keep the mean and std of their replies as `unseen`."""
    cfg = runner.cfg
    pids = runner.clients.holdout_ids()
    if not pids:
        return
    replies = exchange_all(runner, grid, server_round, pids, MessageType.EVALUATE, "eval_down", newcomers=True)
    good, failed, oversized = runner.sort_replies(server_round, replies, "eval_up")
    rows, rejected = evaluation_rows(good, cfg.shift_degrees,
                                     lambda m: finetuned_metrics(m, cfg.shift_degrees, cfg.holdout_finetune_epochs),
                                     "held-out client", required=shifted_metric_keys(cfg))
    runner.round_log.unseen = eval_statistics(rows, failed + oversized + rejected) if rows else None
