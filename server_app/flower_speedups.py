"""A speed-up of Flower 1.41's in-memory simulation runtime, applied when the ServerApp is loaded in the simulation
process: the runtime asks the link state for each node's next message every 0.1 s, and every ask checks every
stored message (expiry, federation) before looking at its destination: O(nodes x messages) checks a sweep, which at
1,000 clients take most of a CPU. Here an ask first looks, without the checks, whether any undelivered message is
for that node, and only then asks Flower. The answers are the same: a node with no undelivered message gets
none either way."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import flwr

PATCHED_VERSION = "1.41.0"  # the Flower version whose internals this was written against; others are left alone


def fast_get_message_ins(original: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    """get_message_ins that skips Flower's per-message checks when no message waits for the node."""
    def get_message_ins(self: Any, node_id: int, limit: int | None, *, run_id: int | None = None) -> list[Any]:
        with self.lock:
            waiting = any(msg.metadata.dst_node_id == node_id and msg.metadata.delivered_at == ""
                          for msg in self.message_ins_store.values())
        return original(self, node_id, limit, run_id=run_id) if waiting else []
    get_message_ins.__wrapped__ = original  # type: ignore[attr-defined]
    return get_message_ins


def apply() -> bool:
    """Install the speed-up on Flower's InMemoryLinkState (once, and only for the version it was written for;
    PFLOWER_FLOWER_SPEEDUPS=0 leaves Flower as it is, e.g. to compare)."""
    if flwr.__version__ != PATCHED_VERSION or os.environ.get("PFLOWER_FLOWER_SPEEDUPS", "1") == "0":
        return False
    try:
        from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    except ImportError:
        return False
    current = InMemoryLinkState.get_message_ins
    if not hasattr(current, "__wrapped__"):
        InMemoryLinkState.get_message_ins = fast_get_message_ins(current)  # type: ignore[method-assign]
    return True
