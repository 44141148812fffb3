"""Round 0 of the algorithms that pre-train (FedAMP's `pretrain-epochs`): every client trains once from the common
initialization before round 1; its traffic and FLOPs count in round 1's record."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO
from typing import Protocol

from flwr.app import Message, MessageType
from flwr.serverapp import Grid
from flwr.supercore import log

from common.config import RunConfig

from .clients import ClientRegistry
from .replies import RoundLog, TrainReply, reply_flops
from .strategies.base import PFLStrategy


class Runner(Protocol):
    """What round 0 uses of the round runner."""

    cfg: RunConfig
    clients: ClientRegistry
    strategy: PFLStrategy
    round_log: RoundLog

    def messages(self, server_round: int, partition_ids: list[int], message_type: str,
                 kind: str) -> list[Message]: ...

    def accept_train_replies(self, server_round: int, replies: Iterable[Message],
                             what: str = ...) -> tuple[list[TrainReply], int, int]: ...


def pretrain_round(runner: Runner, grid: Grid) -> None:
    """Send every client a round-0 training message; the strategy aggregates the replies as round 0."""
    clients = runner.clients.ids()
    messages = runner.messages(0, clients, MessageType.TRAIN, "train_down")
    replies = list(grid.send_and_receive(messages, timeout=runner.cfg.round_timeout))
    accepted, failed, rejected = runner.accept_train_replies(0, replies, "pre-training")
    runner.strategy.aggregate(0, accepted)
    train = runner.round_log.train
    faults = {"late": 0, **{key: train.pop(key) for key in ("dropped", "stragglers", "late") if key in train}}
    train["pretrain"] = {"sent": len(clients), "used": len(accepted), "failed": failed, "rejected": rejected,
                         "flops": sum(reply_flops(r.content) for r in accepted), **faults}
    log(INFO, "pre-training: %d of %d clients trained from the common initialization", len(accepted), len(clients))
