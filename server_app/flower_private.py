"""The one adapter to Flower's internals: what this project does that Flower's public API has no way for. Each
part names the Flower version it was checked against, and tests pin the attributes it relies on
(tests/test_flower_private.py), so a Flower release that changes them fails there, not mid-run.

1. Message stamps (the in-process engine): a SuperLink stamps each message with its id, run and source node, and
   Flower's Message API has no public setter for them.
2. The task identity (the in-process engine): Flower's messages read the run and node of the task running in the
   process from `TaskIdentity`, which Flower's own runtimes set.
3. A speed-up of Flower's in-memory simulation runtime, applied by the ServerApp when it starts in the simulation
   process: the runtime asks the link state for each node's next message every 0.1 s, and every ask checks every
   stored message (expiry, federation) before looking at its destination: O(nodes x messages) checks a sweep, which
   at 1,000 clients take most of a CPU. Here the link state keeps the set of nodes that may have an undelivered
   message (a node enters when a message for it is stored, and leaves when Flower finds none for it), and an ask
   for any other node returns at once. The answers are the same: a node with no undelivered message gets none
   either way.
4. Which runtime drives the ServerApp: Flower's simulation hands it an `InMemoryGrid` (checked with 1.42.0), a
   deployment an `HttpGrid` to its SuperLink; Flower has no public way to ask.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import flwr
from flwr.app import Message
from flwr.supercore.task_identity import TaskIdentity

# ----- 1. message stamps -----
PRIVATE_FIELDS = ("_message_id", "_run_id", "_src_node_id")  # Metadata's attributes behind its read-only properties


def stamp(message: Message, message_id: str, run_id: int | None = None, src_node_id: int | None = None) -> Message:
    """Give `message` the id (and run and source node, where given) a SuperLink would; returns it."""
    fields = message.metadata.__dict__
    fields[PRIVATE_FIELDS[0]] = message_id
    if run_id is not None:
        fields[PRIVATE_FIELDS[1]] = run_id
    if src_node_id is not None:
        fields[PRIVATE_FIELDS[2]] = src_node_id
    return message


# ----- 2. the task identity -----


def set_task_identity(run_id: int, node_id: int, task_id: int) -> None:
    """Name the task this process runs (its run, node and task ids), as Flower's runtimes do before a message is
    made or handled."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, node_id, task_id


# ----- 3. the in-memory link state -----
PATCHED_VERSION = "1.42.0"  # the Flower version whose internals this was checked against (its in-memory link
# state is 1.41.0's, for which it was written); others are left alone
INDEX = "_pflower_waiting_nodes"  # the link state's attribute: node ids that may have an undelivered message


def _waiting(state: Any) -> set[int]:
    """The state's set of nodes that may have an undelivered message (built from its store on first use; call with
    its lock held)."""
    waiting = state.__dict__.get(INDEX)
    if waiting is None:
        waiting = {
            msg.metadata.dst_node_id for msg in state.message_ins_store.values() if msg.metadata.delivered_at == ""
        }
        state.__dict__[INDEX] = waiting
    return waiting


def fast_get_message_ins(original: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    """get_message_ins that asks Flower only for nodes that may have an undelivered message."""

    def get_message_ins(self: Any, node_id: int, limit: int | None, *, run_id: int | None = None) -> list[Any]:
        with self.lock:  # an RLock: Flower's method takes it again
            waiting = _waiting(self)
            if node_id not in waiting:
                return []
            found = original(self, node_id, limit, run_id=run_id)
            if not found and run_id is None:
                waiting.discard(node_id)
            return found

    get_message_ins.__wrapped__ = original  # type: ignore[attr-defined]
    return get_message_ins


def indexed_store_message_ins(original: Callable[..., Any]) -> Callable[..., Any]:
    """store_message_ins that records the destination of every message it stores."""

    def store_message_ins(self: Any, message: Any) -> Any:
        with self.lock:
            message_id = original(self, message)
            if message_id:
                _waiting(self).add(message.metadata.dst_node_id)
            return message_id

    store_message_ins.__wrapped__ = original  # type: ignore[attr-defined]
    return store_message_ins


def speed_up_simulation() -> bool:
    """Install the speed-up on Flower's InMemoryLinkState (once, and only for the version it was written for;
    PFLOWER_FLOWER_SPEEDUPS=0 leaves Flower as it is, e.g. to compare)."""
    if flwr.__version__ != PATCHED_VERSION or os.environ.get("PFLOWER_FLOWER_SPEEDUPS", "1") == "0":
        return False
    # only where Flower's in-memory link state is loaded already (the simulation's process imports it before the
    # ServerApp): elsewhere (a deployment, the in-process engine) importing it would load the SuperLink's
    # database stack for nothing
    module = sys.modules.get("flwr.server.superlink.linkstate.in_memory_linkstate")
    if module is None:
        return False
    InMemoryLinkState: Any = module.InMemoryLinkState
    if not hasattr(InMemoryLinkState.get_message_ins, "__wrapped__"):
        InMemoryLinkState.store_message_ins = indexed_store_message_ins(InMemoryLinkState.store_message_ins)
        InMemoryLinkState.get_message_ins = fast_get_message_ins(InMemoryLinkState.get_message_ins)
    return True


# ----- 4. the runtime -----
SIMULATION_GRID = ("flwr.superlink.grid.inmemory_grid", "InMemoryGrid")  # the grid Flower's simulation hands over


def is_simulation(grid: Any) -> bool:
    """True when `grid` is Flower's simulation (every node a process of the run's own) or a grid that says it is
    one (`simulation = True`: the in-process engine's); False for a SuperLink, whose nodes are devices."""
    if getattr(type(grid), "simulation", False) is True:
        return True
    module = sys.modules.get(SIMULATION_GRID[0])  # loaded where Flower's simulation runs, never imported here
    return module is not None and isinstance(grid, getattr(module, SIMULATION_GRID[1]))
