"""The one exchange loop every message of a run goes through (the handshake, training, evaluation, pre-training,
the newcomers' evaluation): messages to many clients with at most `window` out at once, each batch built only when
slots free, and replies handed on as they arrive. The server holds a window of messages and replies, not all of
them (pre-training or evaluating thousands of clients), and the workers never wait for the slowest message of a
chunk."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from logging import WARNING
from typing import TypeVar

import httpx
from flwr.app import Message
from flwr.serverapp import Grid
from flwr.supercore import log

from common import profiling

Build = Callable[[list[int]], list[Message]]  # the messages to a batch of targets, in their order
PULL_INTERVAL_S = 0.05  # between two looks for replies while none came
PATIENCE_S = 300.0  # how long a read of the SuperLink's is retried while it answers with a server error
T = TypeVar("T")


def _transient(exc: Exception) -> bool:
    """A SuperLink error worth asking again: a 5xx answer (its database busy: 'database is locked' under load) or a
    dropped connection; Flower itself retries only 502-504 and raises the rest into the ServerApp."""
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500
    return isinstance(exc, httpx.TransportError)


def patient(
    read: Callable[[], T], what: str, patience: float = PATIENCE_S, sleep: Callable[[float], None] | None = None
) -> T:
    """`read()` (a read of the SuperLink's: replies, connected nodes), asked again with backoff (0.5 s doubling to
    30 s) while it fails with a transient server error, for `patience` seconds at most: a busy SuperLink delays a
    round instead of ending the run. Reads only, never a push (pushing again could store a message twice); replies
    that a failed pull had already taken from the SuperLink's store do not come again and are given up at the
    round-timeout like any late reply."""
    waited, wait = 0.0, 0.5
    while True:
        try:
            return read()
        except Exception as exc:
            if not _transient(exc) or waited >= patience:
                raise
            log(WARNING, "the SuperLink failed to answer %s (%s): asking again in %.1f s", what, _short(exc), wait)
            (sleep or time.sleep)(wait)
            waited += wait
            wait = min(2 * wait, 30.0)


def _pull(grid: Grid, message_ids: list[str]) -> list[Message]:
    return list(grid.pull_messages(message_ids))


def _short(exc: Exception) -> str:
    """An error in one line: an HTTP status and its reason, or the exception's name."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return type(exc).__name__


def _wait() -> None:
    """Sleep one pull interval (timed as Flower's: the server waits on its round trip)."""
    time.sleep(PULL_INTERVAL_S)
    profiling.add("flower", PULL_INTERVAL_S)


def exchange(
    grid: Grid,
    targets: list[int],
    build: Build,
    window: int,
    timeout: float,
    on_given_up: Callable[[int], None] | None = None,
    renew_on_reply: bool = False,
) -> Iterator[list[Message]]:
    """The replies to messages for `targets` (clients' partition ids; node ids in the handshake), as lists of those
    that arrived together, with at most `window` messages out at once (a window as large as the list builds every
    message at once, before any reply is read); a message unanswered `timeout` seconds after it was sent (not after
    its batch began to be built: FedAMP's first cloud models at 10,000 clients take longer than the timeout) is
    given up, with a warning. On a grid that says when a message starts (the in-process engine's
    `message_started`), the timeout runs from then: a message queued behind others for the same few worker
    processes is not late, so a loaded machine's longer queues do not change which replies a run uses.
    `on_given_up` hears how many were given up, as they are (the round's record counts them). With
    `renew_on_reply`, every reply restarts the wait of the messages still out: the run's first handshake waits as
    long as nodes keep answering (20 ClientApps starting at once on 2 cores answer one after another for minutes),
    and `timeout` after the last answer at most."""
    started: Callable[[str], bool] | None = getattr(grid, "message_started", None)
    forget: Callable[[list[str]], None] | None = getattr(grid, "forget_messages", None)  # the in-process engine's
    todo = list(targets)
    pending: dict[str, float | None] = {}  # message id -> deadline (None: still queued, not started)
    given_up = 0
    while todo or pending:
        if todo and len(pending) < window:
            batch, todo = todo[: window - len(pending)], todo[window - len(pending) :]
            messages = build(batch)
            sent = grid.push_messages(messages)
            deadline = time.monotonic() + timeout
            pending.update((mid, deadline if started is None else None) for mid in sent)
        replies = patient(partial(_pull, grid, list(pending)), "a pull of replies")
        for reply in replies:
            pending.pop(reply.metadata.reply_to_message_id, None)
        now = time.monotonic()
        if replies and renew_on_reply:
            pending = {mid: None if due is None else now + timeout for mid, due in pending.items()}
        if started is not None:
            for mid in [mid for mid, due in pending.items() if due is None and started(mid)]:
                pending[mid] = now + timeout
        expired = [mid for mid, due in pending.items() if due is not None and due <= now]
        for mid in expired:
            del pending[mid]
        if expired and forget is not None:
            forget(expired)
        given_up += len(expired)
        if expired and on_given_up is not None:
            on_given_up(len(expired))
        if given_up and not pending and not todo:
            log(
                WARNING,
                "%d message(s) unanswered %g s after they were sent (round-timeout): given up",
                given_up,
                timeout,
            )
        if replies:
            yield replies
        elif pending:
            _wait()


def each_reply(chunks: Iterable[list[Message]]) -> Iterator[Message]:
    """The replies of an exchange one at a time, as they arrive."""
    for chunk in chunks:
        yield from chunk
