"""The in-process engine's Grid: Flower's Grid interface over a pool of worker processes instead of a SuperLink and
SuperNodes. Each message's records cross to a worker as the bytes Flower serializes them into and are rebuilt there
(transport.py), the reply likewise on the way back; each node's client state waits in shared memory between its
messages (states.py); replies are pulled as they finish. The round runner works on it unchanged."""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Executor, Future, ProcessPoolExecutor, wait
from logging import ERROR
from typing import Any
from uuid import uuid4

from flwr.app import Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore import log
from flwr.supercore.run import Run

from client_app.state import Kept
from common.wire.messages import NUM_PARTITIONS, PARTITION_ID
from experiments.engine import worker
from experiments.engine.blobs import (
    LOCK_SUFFIX,
    PREFIX_ENV,
    BlobRef,
    SharedArrays,
    drop,
    hold_run_lock,
    release_run_lock,
    sweep,
    sweep_orphans,
)
from experiments.engine.states import HeldStates, pack
from experiments.engine.transport import Records, blob_refs, num_bytes, records_in, records_out
from experiments.engine.worker import Outcome, Task
from server_app.flower_private import set_task_identity, stamp

PULL_WAIT_S = 0.05  # how long a pull waits for the first reply when none is ready (the runner's pull interval)
MAX_RESTARTS = 3  # worker pools replaced before the run is given up
_inline_for = ""  # the shared-memory prefix (unique per grid) of the inline grid this process's worker serves
FIRST_NODE_ID = 1_000  # node ids are FIRST_NODE_ID + partition id: readable in logs, never Flower's own id 1


class InlineExecutor(Executor):
    """Runs each submitted call at once in this process (workers=0)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """A future that is already done."""
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future


class InProcessGrid(Grid):
    """`num_nodes` simulated nodes (partition ids 0..num_nodes-1) answered by `workers` worker processes, each
    running the ClientApp on `threads` torch threads (workers=0: in this process, one message at a time)."""

    simulation = True  # every node is this run's own process (server_app/flower_private.is_simulation)

    def __init__(
        self,
        run_config: dict[str, Any],
        num_nodes: int,
        workers: int,
        threads: int = 1,
        run_id: int = 1,
        log_level: int = logging.INFO,
    ) -> None:
        self._run = Run.create_empty(run_id)
        self._run_config = dict(run_config)
        self._workers, self._threads, self._log_level = workers, threads, log_level
        self.node_config = {
            FIRST_NODE_ID + pid: {PARTITION_ID: pid, NUM_PARTITIONS: num_nodes} for pid in range(num_nodes)
        }
        self.held = HeldStates()  # node -> the client state the engine keeps for it
        self._shared = SharedArrays()  # array payloads of the messages in flight, in shared memory
        self._pending: dict[str, tuple[int, Message, Future[Outcome], list[BlobRef]]] = {}  # message id -> node,
        # the message, its outcome to come and the shared-memory blocks it uses
        self._ready: dict[str, Message] = {}  # replies collected but not pulled yet
        self._contexts: dict[int, Records] = {}  # each node's Flower context state, as the message left it
        self._forgotten: set[str] = set()  # pending messages the server gave up: their replies are not kept
        self._latest: dict[int, str] = {}  # node -> the id of its latest message still pending
        self.clientapp_seconds = 0.0  # time the ClientApps took, summed over messages
        self.bytes_moved = 0  # serialized bytes of messages and replies (states aside)
        self.restarts = 0  # pools replaced after a worker died
        sweep_orphans()  # what killed runs left in shared memory
        self._prefix = os.environ[PREFIX_ENV] = f"pfl{os.getpid()}-{uuid4().hex[:8]}-"  # the workers inherit it
        self._lock = hold_run_lock(self._prefix)  # held while the run lives: its blocks are not orphans
        self._pool = self._new_pool()

    def _new_pool(self) -> Executor:
        if self._workers == 0:  # inline: the ClientApp in this process, one message at a time (profiling, tests);
            return InlineExecutor()  # the worker is started for it by its first message (_submit)
        # spawn: a fresh interpreter per worker (no forked torch or thread state), started once for the run
        return ProcessPoolExecutor(
            max_workers=self._workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=worker.start,
            initargs=(self._run_config, self._threads, self._log_level),
        )

    # ----- Grid ----------------------------------------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        """Set the run this grid serves."""
        self._run = run

    @property
    def run(self) -> Run:
        """The run this grid serves."""
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        """A new message (Flower deprecates this in favour of the Message constructor)."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """The simulated nodes' ids."""
        return list(self.node_config)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Hand each message to the pool; returns their ids. A message to an unknown node gets an error reply."""
        ids = []
        for msg in messages:
            message_id = str(uuid4())
            stamp(msg, message_id, self._run.run_id, SUPERLINK_NODE_ID)
            node = msg.metadata.dst_node_id
            ids.append(message_id)
            if node not in self.node_config:
                self._ready[message_id] = _error(msg, f"node {node} is not a node of this run")
                continue
            if node in self._latest:  # its earlier message must finish first: its state goes into this one
                self._collect(self._latest[node])
            content = records_out(msg.content, self._shared.share)
            self.bytes_moved += num_bytes(content)
            task = Task(
                self._run.run_id,
                node,
                self.node_config[node],
                message_id,
                msg.metadata.message_type,
                msg.metadata.group_id,
                msg.metadata.ttl,
                content,
                self.held.get(node),
                self._contexts.get(node, []),
            )
            self._pending[message_id] = (node, msg, self._submit(task), blob_refs(content))
            self._latest[node] = message_id
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies that are ready among `message_ids`; when none is, wait up to PULL_WAIT_S for the first."""
        wanted = list(message_ids)
        if not any(mid in self._ready or (mid in self._pending and self._pending[mid][2].done()) for mid in wanted):
            futures = [self._pending[mid][2] for mid in wanted if mid in self._pending]
            if futures:
                wait(futures, timeout=PULL_WAIT_S, return_when=FIRST_COMPLETED)
        for mid in wanted + [mid for mid in self._forgotten if self._pending[mid][2].done()]:
            if mid in self._pending and self._pending[mid][2].done():
                self._collect(mid)
        return [self._ready.pop(mid) for mid in wanted if mid in self._ready]

    def forget_messages(self, message_ids: Iterable[str]) -> None:
        """The server gave these messages up (round-timeout, server_app/exchange.py): a reply already collected is
        dropped, one still to come is dropped when its worker is done (its node's new state is kept), so late
        replies do not pile up over a long run."""
        for mid in message_ids:
            self._ready.pop(mid, None)
            if mid in self._pending:
                self._forgotten.add(mid)

    def message_started(self, message_id: str) -> bool:
        """Whether a worker took the message up (or it was answered): until then it waits in the pool's queue, and
        the round timeout does not run for it (server_app/exchange.py)."""
        entry = self._pending.get(message_id)
        return entry is None or entry[2].running() or entry[2].done()

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Push the messages and pull their replies until all came or `timeout` seconds passed."""
        pending = set(self.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while pending and (deadline is None or time.monotonic() < deadline):
            got = list(self.pull_messages(pending))
            pending.difference_update(r.metadata.reply_to_message_id for r in got)
            replies.extend(got)
        return replies

    def _submit(self, task: Task) -> Future[Outcome]:
        """Hand a task to the pool; a pool found broken (a worker died since the last message) is replaced first."""
        from concurrent.futures.process import BrokenProcessPool

        if self._workers == 0:  # several inline grids may share this process: the worker answers for this one
            global _inline_for  # (started again only when another grid used it last: a start reads a data export)
            os.environ[PREFIX_ENV] = self._prefix
            if _inline_for != self._prefix:
                worker.start(self._run_config, self._threads, self._log_level)
                _inline_for = self._prefix
            try:
                return self._pool.submit(worker.answer, task)
            finally:  # the process is the server's again
                set_task_identity(self._run.run_id, SUPERLINK_NODE_ID, self._run.run_id)
        try:
            return self._pool.submit(worker.answer, task)
        except BrokenProcessPool:
            self._restart_if_broken()
            return self._pool.submit(worker.answer, task)

    # ----- replies -------------------------------------------------------------------------------------------
    def _collect(self, message_id: str) -> None:
        """Wait for a pending message's outcome; keep its node's new state and its reply (an error reply when the
        worker could not answer: it died, or the outcome could not be sent back)."""
        node, msg, future, shared = self._pending.pop(message_id)
        forgotten = message_id in self._forgotten
        self._forgotten.discard(message_id)
        if self._latest.get(node) == message_id:
            del self._latest[node]
        try:
            outcome = future.result()
        except Exception as exc:  # the pool broke (a worker killed, e.g. out of memory) or a transfer failed
            self._shared.release(shared)
            log(ERROR, "node %s: no reply from its worker process: %s: %s", node, type(exc).__name__, exc)
            if not forgotten:
                self._ready[message_id] = _error(msg, f"worker process failed: {type(exc).__name__}: {exc}")
            self._restart_if_broken()
            return
        self._shared.release(shared)
        self.clientapp_seconds += outcome.seconds
        if outcome.kept is not None:
            self.held.put(node, outcome.kept, busy=self._latest)
        if outcome.context_state:
            self._contexts[node] = outcome.context_state
        else:
            self._contexts.pop(node, None)
        if forgotten:  # nobody will read the reply: free its shared blocks unread
            for ref in blob_refs(outcome.content):
                drop(ref)
            return
        if outcome.content is None:
            code, reason = outcome.error or (ErrorCode.UNKNOWN, "no reply")
            reply = Message(Error(code=code, reason=reason), reply_to=msg)
        else:
            self.bytes_moved += num_bytes(outcome.content)
            reply = Message(records_in(outcome.content, unlink=True), reply_to=msg)
        self._ready[message_id] = stamp(reply, str(uuid4()))

    def hold_state(self, node: int, kept: Kept) -> None:
        """Give the engine a node's client state as a message would have left it (tests; a tool seeding state)."""
        os.environ[PREFIX_ENV] = self._prefix
        self.held.put(node, pack(kept), busy=self._latest)

    def persist_client_state(self, checkpoint_round: int | None) -> None:
        """Write every client state the engine holds and the state dirs lack (the server is about to write a
        checkpoint; `checkpoint_round`: its last one before this). Messages still in flight are waited for first."""
        for message_id in list(self._pending):
            self._collect(message_id)
        self.held.write_all(checkpoint_round)

    def _restart_if_broken(self) -> None:
        """A pool whose worker died refuses all work: replace it (messages in flight get error replies); give the
        run up when workers keep dying (they cannot start, or every client runs out of memory)."""
        from concurrent.futures.process import BrokenProcessPool

        from server_app.clients import RunAborted

        try:
            self._pool.submit(int).result()
        except BrokenProcessPool:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self.restarts += 1
            if self.restarts > MAX_RESTARTS:
                raise RunAborted(
                    f"the worker processes died {self.restarts} times (out of memory? see the errors "
                    "above); giving the run up"
                ) from None
            self._pool = self._new_pool()

    def close(self) -> None:
        """Stop the worker processes; free the shared memory of messages never answered."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        for message_id in list(self._pending):
            _, _, future, _ = self._pending[message_id]
            if future.done() and not future.cancelled() and future.exception() is None:
                outcome = future.result()
                kept = [] if outcome.kept is None else outcome.kept.blocks()
                for ref in blob_refs(outcome.content) + kept:
                    drop(ref)
        self._pending.clear()
        self._forgotten.clear()
        self._shared.close()
        self.held.close()
        sweep(self._prefix, keep=self._prefix + LOCK_SUFFIX)  # blocks of replies never read (a worker died mid-message)
        if self._lock >= 0:
            release_run_lock(self._prefix, self._lock)
            self._lock = -1
        if os.environ.get(PREFIX_ENV) == self._prefix:
            del os.environ[PREFIX_ENV]

    def __enter__(self) -> InProcessGrid:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _error(msg: Message, reason: str) -> Message:
    """An error reply to `msg`, as the SuperLink sends for a message no node answered."""
    return stamp(Message(Error(code=ErrorCode.UNKNOWN, reason=reason), reply_to=msg), str(uuid4()))
