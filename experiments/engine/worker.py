"""The client side of the in-process engine: a worker process that imports the ClientApp once, then answers each
message it is handed with it, as a SuperNode's ClientApp process would (the message and the node's client state
in; the reply and the state it left out)."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from logging import ERROR
from pathlib import Path
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from client_app.state import StateHost, host_state
from experiments.engine.blobs import put
from experiments.engine.states import StateBlock, forget_contents, pack, unpack
from experiments.engine.transport import Records, records_in, records_out
from server_app.flower_private import set_task_identity, stamp


@dataclass(frozen=True)
class Task:
    """One message for one node: its header, its content, and the client state the engine keeps for the node."""

    run_id: int
    node_id: int
    node_config: dict[str, Any]
    message_id: str
    message_type: str
    group_id: str
    ttl: float
    content: Records
    kept: StateBlock | None = None  # the client state the engine keeps for the node (states.py)
    context_state: Records = field(
        default_factory=list
    )  # the node's Flower context state, kept across messages as Flower's engines do


@dataclass(frozen=True)
class Outcome:
    """The node's reply (its content, or an error's code and reason), the seconds its ClientApp took, and the client
    state the message left."""

    content: Records | None
    error: tuple[int, str] | None
    seconds: float
    kept: StateBlock | None = None  # the client state the message left, when it changed or was read from disk
    context_state: Records = field(
        default_factory=list
    )  # the node's context state after the message (secure aggregation's session)


_APP: ClientApp | None = None
_RUN_CONFIG: dict[str, Any] = {}
_HOST: StateHost | None = None
_FAILURES: set[tuple[str, str]] = set()  # errors this worker has logged with their traceback


def start(run_config: dict[str, Any], threads: int, log_level: int) -> None:
    """Worker initializer: torch on `threads` threads, the ClientApp imported once, the run's config kept, client
    state kept by the engine."""
    global _APP, _RUN_CONFIG, _HOST
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(threads)
    # optimizers and the FLOP counter import torch._dynamo at their first use (1-1.5 s): a long-lived worker pays it
    # at its start, not in round 1 (a device's ClientApp, a process per message, pays it only for training)
    import torch._dynamo

    from client_app.app import app
    from experiments.run.exports import ENV, serve_export

    if os.environ.get(ENV):  # the server serves the data set from an export: so do its workers
        serve_export(Path(os.environ[ENV]))
    _APP, _RUN_CONFIG = app, dict(run_config)
    _HOST = StateHost()
    forget_contents()  # an inline worker starting for another grid: the last one's blocks are gone
    logging.getLogger("flwr").setLevel(log_level)


def answer(task: Task) -> Outcome:
    """Run the ClientApp on the task's message with the node's context. A ClientApp that raises gives an error reply
    with Flower's code for it and the reason in one line (the server logs it), and is logged here with its traceback
    (once per kind of error); an error reply the ClientApp returns (a simulated drop) is passed on unlogged."""
    if _APP is None or _HOST is None:
        raise RuntimeError("worker not started")
    started = time.perf_counter()
    set_task_identity(task.run_id, task.node_id, task.run_id)
    msg = Message(
        records_in(task.content),
        dst_node_id=task.node_id,
        message_type=task.message_type,
        ttl=task.ttl,
        group_id=task.group_id,
    )
    stamp(msg, task.message_id, task.run_id, 1)
    context = Context(
        run_id=task.run_id,
        node_id=task.node_id,
        node_config=dict(task.node_config),
        state=records_in(task.context_state),  # client state comes through the StateHost; this is Flower's own
        run_config=dict(_RUN_CONFIG),
    )
    content: Records | None = None
    error: tuple[int, str] | None = None
    _HOST.begin(unpack(task.kept, share=True) if task.kept is not None else None)
    host_state(_HOST)  # for this message only: an inline worker shares its process with the server
    try:
        reply = _APP(msg, context)
        if reply.has_error():  # returned, not raised (a simulated drop, refused state): passed on as it is
            error = (int(reply.error.code), str(reply.error.reason))
        else:
            content = records_out(reply.content, put)
    except Exception as exc:  # the server gets an error reply
        seen = (type(exc).__name__, str(exc))
        logging.getLogger("flwr").log(
            ERROR,
            "client app failed on node %s%s",
            task.node_id,
            f": {seen[0]}: {seen[1]} (traceback above)" if seen in _FAILURES else "",
            exc_info=seen not in _FAILURES,
        )
        _FAILURES.add(seen)
        reason = f"ClientApp raised {type(exc).__name__}: {exc}".replace("\n", " ")
        error = (ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason)
    finally:
        host_state(None)
    left = pack(_HOST.outgoing) if _HOST.outgoing is not None else None
    _HOST.begin(None)
    return Outcome(content, error, time.perf_counter() - started, left, records_out(context.state))
