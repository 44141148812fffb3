"""The client side of the in-process engine: a worker process that imports the ClientApp once, then answers each
message it is handed with it, as a SuperNode's ClientApp process would (the node's context in, the reply and the
updated context out, both as serialized objects)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from logging import ERROR
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.supercore.task_identity import TaskIdentity

from .transport import Packed, pack, unpack_message, unpack_record


@dataclass(frozen=True)
class Task:
    """One message for one node: who it goes to, the message and the node's context state (None: empty)."""

    run_id: int
    node_id: int
    node_config: dict[str, Any]
    message_id: str
    message: Packed
    state: Packed | None


@dataclass(frozen=True)
class Outcome:
    """The node's reply, its context state afterwards (None: empty) and the seconds its ClientApp took."""

    reply: Packed
    state: Packed | None
    seconds: float


_APP: ClientApp | None = None
_RUN_CONFIG: dict[str, Any] = {}


def start(run_config: dict[str, Any], threads: int, log_level: int) -> None:
    """Worker initializer: torch on `threads` threads, the ClientApp imported once, the run's config kept."""
    global _APP, _RUN_CONFIG
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(threads)
    from client_app.app import app

    _APP, _RUN_CONFIG = app, dict(run_config)
    logging.getLogger("flwr").setLevel(log_level)


def error_reply(msg: Message, exc: BaseException) -> Message:
    """The error reply for a ClientApp that raised (Flower's code for it; the reason in one line)."""
    reason = f"ClientApp raised {type(exc).__name__}: {exc}".replace("\n", " ")
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)


def answer(task: Task) -> Outcome:
    """Run the ClientApp on the task's message with the node's context; a ClientApp that raises gives an error
    reply (a simulated drop is logged once, by the server that reads the reply; anything else also with its
    traceback here)."""
    import time

    from client_app.app import SimulatedDrop

    if _APP is None:
        raise RuntimeError("worker not started")
    started = time.perf_counter()
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = task.run_id, task.node_id, task.run_id
    msg = unpack_message(task.message, task.message_id)
    state = unpack_record(task.state) if task.state is not None else RecordDict()
    context = Context(run_id=task.run_id, node_id=task.node_id, node_config=dict(task.node_config), state=state,
                      run_config=dict(_RUN_CONFIG))
    try:
        reply = _APP(msg, context)
    except SimulatedDrop as exc:
        reply = error_reply(msg, exc)
    except Exception as exc:  # a ClientApp bug: the server gets an error reply, the log the traceback
        logging.getLogger("flwr").log(ERROR, "client app failed on node %s", task.node_id, exc_info=True)
        reply = error_reply(msg, exc)
    kept = context.state if (context.state.array_records or context.state.metric_records
                             or context.state.config_records) else None
    return Outcome(pack(reply), None if kept is None else pack(kept), time.perf_counter() - started)
