"""Messages to many clients with at most `messages-in-flight` out at once, each built only when a slot frees, and
replies handed on as they arrive: the server holds a window of messages and replies, not all of them (pre-training
or evaluating thousands of clients), and the workers never wait for the slowest message of a chunk."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Protocol

from flwr.app import Message
from flwr.serverapp import Grid

from common import profiling
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

    def messages(
        self, server_round: int, partition_ids: list[int], message_type: str, kind: str, newcomers: bool = ...
    ) -> list[Message]: ...

    def sort_replies(
        self, server_round: int, replies: Iterable[Message], kind: str
    ) -> tuple[list[tuple[int, Message]], int, int]: ...

    def accept_train_replies(
        self, server_round: int, replies: Iterable[Message], what: str = ...
    ) -> tuple[list[TrainReply], int, int]: ...


PULL_INTERVAL_S = 0.05  # between two looks for replies while none came


def _wait() -> None:
    """Sleep one pull interval (timed as Flower's: the server waits on its round trip)."""
    time.sleep(PULL_INTERVAL_S)
    profiling.add("flower", PULL_INTERVAL_S)


def stream_replies(grid: Grid, messages: Iterable[Message], timeout: float) -> Iterator[Message]:
    """Send the messages, then yield their replies as they arrive, until all came or `timeout` seconds passed
    (what Grid.send_and_receive returns, one reply at a time, so each can be checked while others still train)."""
    pending = set(grid.push_messages(messages))
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        replies = list(grid.pull_messages(list(pending)))
        for reply in replies:
            pending.discard(reply.metadata.reply_to_message_id)
            yield reply
        if not replies:
            _wait()


def exchange(
    runner: RunnerView,
    grid: Grid,
    server_round: int,
    partition_ids: list[int],
    message_type: str,
    kind: str,
    newcomers: bool = False,
) -> Iterator[list[Message]]:
    """The replies of a sliding window of at most `messages-in-flight` messages, as lists of those that arrived
    together; a message unanswered `round-timeout` seconds after it was sent is given up."""
    window, timeout = runner.cfg.messages_in_flight, runner.cfg.round_timeout
    todo = list(partition_ids)
    pending: dict[str, float] = {}  # message id -> deadline
    while todo or pending:
        if todo and len(pending) < window:
            batch, todo = todo[: window - len(pending)], todo[window - len(pending) :]
            deadline = time.monotonic() + timeout
            pending.update(
                (mid, deadline)
                for mid in grid.push_messages(runner.messages(server_round, batch, message_type, kind, newcomers))
            )
        replies = list(grid.pull_messages(list(pending)))
        for reply in replies:
            pending.pop(reply.metadata.reply_to_message_id, None)
        now = time.monotonic()
        for mid in [mid for mid, due in pending.items() if due <= now]:
            del pending[mid]
        if replies:
            yield replies
        elif pending:
            _wait()


def exchange_all(
    runner: RunnerView,
    grid: Grid,
    server_round: int,
    partition_ids: list[int],
    message_type: str,
    kind: str,
    newcomers: bool = False,
) -> list[Message]:
    """Every reply of a chunked exchange (for replies that are small: evaluation metrics)."""
    return [
        reply
        for chunk in exchange(runner, grid, server_round, partition_ids, message_type, kind, newcomers)
        for reply in chunk
    ]
