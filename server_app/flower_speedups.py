"""A speed-up of Flower 1.42's in-memory simulation runtime, applied when the ServerApp is loaded in the simulation
process: the runtime asks the link state for each node's next message every 0.1 s, and every ask checks every
stored message (expiry, federation) before looking at its destination: O(nodes x messages) checks a sweep, which at
1,000 clients take most of a CPU. Here the link state keeps the set of nodes that may have an undelivered message
(a node enters when a message for it is stored, and leaves when Flower finds none for it), and an ask for any other
node returns at once. The answers are the same: a node with no undelivered message gets none either way."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import flwr

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


def apply() -> bool:
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
