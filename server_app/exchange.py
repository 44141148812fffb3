"""Messages to many clients in chunks of `messages-in-flight`: each chunk is built, sent and answered before the
next is built, so the server holds one chunk's messages and replies at a time (pre-training or evaluating
thousands of clients)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from flwr.app import Message
from flwr.serverapp import Grid

from common.config import RunConfig

from .clients import ClientRegistry
from .replies import RoundLog, TrainReply
from .strategies.base import PFLStrategy


class RunnerView(Protocol):
    """What chunked sending, pre-training and the newcomers' evaluation use of the round runner."""

    cfg: RunConfig
    clients: ClientRegistry
    strategy: PFLStrategy
    round_log: RoundLog

    def messages(self, server_round: int, partition_ids: list[int], message_type: str, kind: str,
                 newcomers: bool = ...) -> list[Message]: ...

    def sort_replies(self, server_round: int, replies: Iterable[Message],
                     kind: str) -> tuple[list[tuple[int, Message]], int, int]: ...

    def accept_train_replies(self, server_round: int, replies: Iterable[Message],
                             what: str = ...) -> tuple[list[TrainReply], int, int]: ...


def exchange(runner: RunnerView, grid: Grid, server_round: int, partition_ids: list[int], message_type: str, kind: str,
             newcomers: bool = False) -> Iterator[list[Message]]:
    """The replies of each chunk of clients, chunk after chunk (the round timeout applies to each chunk)."""
    step = runner.cfg.messages_in_flight
    for start in range(0, len(partition_ids), step):
        chunk = runner.messages(server_round, partition_ids[start:start + step], message_type, kind, newcomers)
        yield list(grid.send_and_receive(chunk, timeout=runner.cfg.round_timeout))


def exchange_all(runner: RunnerView, grid: Grid, server_round: int, partition_ids: list[int], message_type: str,
                 kind: str, newcomers: bool = False) -> list[Message]:
    """Every reply of a chunked exchange (for replies that are small: evaluation metrics)."""
    return [reply for chunk in exchange(runner, grid, server_round, partition_ids, message_type, kind, newcomers)
            for reply in chunk]
