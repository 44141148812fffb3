"""A bound on what one SuperNode may make the SuperLink store per message, enforced in the SuperLink before anything
is stored: `pflower-superlink` runs Flower's `flower-superlink` (same arguments) with its Fleet API's PushMessages
refused when the message's object tree has more than `--max-message-objects` objects, and PushObject refused once
the objects of one message's session pass `--max-message-bytes`.

Why: Flower registers a reply's whole object tree in the SuperLink's store when the reply is pushed, before the
ServerApp sees it (and before this project's reply limits can), and it has no bound of its own on the tree (checked
with Flower 1.42.0). A proxy cannot count objects inside a protobuf body: one 6 MiB request carries a tree of
80,000 object ids. Checked against the handlers of `flwr.superlink.servicer.fleet.fleet_handlers`, which both the
Fleet HTTP API and the legacy gRPC servicer call through the module.

It also lets the SuperLink's SQLite store wait up to `SQLITE_BUSY_TIMEOUT_MS` for a write lock instead of Flower's 5 s:
under load (20 SuperNodes' ClientApps starting on 2 cores) requests waited longer than 5 s, got HTTP 500 ('database
is locked'), and Flower's clients retry only 502-504: a ServerApp died of one on a pull, and the SuperLink's own
ServerApp executor (`flower-superexec`) of one on its acquire-task, after which no run could start. The command also
starts that executor again when it dies (server_app/executor_watch.py).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from logging import WARNING
from typing import Any

from server_app import executor_watch

DEFAULT_MAX_OBJECTS = 4_096  # a reply of this project: ~1 object per array, per 5 MiB chunk and per record
DEFAULT_MAX_BYTES = 512 << 20  # a 128M-parameter float32 model and its masks; devices here send far less
SESSIONS_KEPT = 100_000  # sessions whose bytes are counted (the oldest forgotten first)
SQLITE_BUSY_TIMEOUT_MS = 60_000  # how long a request waits for the store's write lock before 'database is locked'


@dataclass(frozen=True)
class LinkBounds:
    """The most one pushed message may make the SuperLink store."""

    max_objects: int = DEFAULT_MAX_OBJECTS
    max_bytes: int = DEFAULT_MAX_BYTES


def count_objects(tree: Any, limit: int) -> int:
    """Objects in a Flower ObjectTree (the root and every descendant), counted without recursion and stopping at
    `limit + 1`: the count of an 80,000-object tree costs no more than the bound."""
    count, stack = 0, [tree]
    while stack:
        node = stack.pop()
        count += 1
        if count > limit:
            return count
        stack.extend(node.children)
    return count


def message_refusal(request: Any, bounds: LinkBounds) -> str | None:
    """Why a PushMessages request may not be stored (None: it may): one message with one object tree of at most
    `bounds.max_objects` objects."""
    if len(request.messages_list) != 1 or len(request.message_object_trees) != 1:
        return (
            f"{len(request.messages_list)} messages and {len(request.message_object_trees)} object trees in one "
            "push (one of each expected)"
        )
    objects = count_objects(request.message_object_trees[0], bounds.max_objects)
    if objects > bounds.max_objects:
        return f"an object tree of more than {bounds.max_objects} objects (pflower-superlink --max-message-objects)"
    return None


UNKNOWN_REFILL_S = 60.0  # the sessions the ledger does not hold share max_bytes per this many seconds


class SessionLedger:
    """Bytes each push session (one message's objects) may still store; thread-safe, the oldest sessions forgotten
    past `kept`. A session the ledger does not hold (forgotten, or opened before this process) is not unbounded:
    all such sessions share one allowance of `max_bytes` that refills over UNKNOWN_REFILL_S, so opening 100,000
    sessions to push an old one without a limit (the cliff an attack pass found) buys at most that rate."""

    def __init__(self, max_bytes: int, kept: int = SESSIONS_KEPT, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes, self.kept, self.clock = max_bytes, kept, clock
        self._left: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self._spare, self._spare_at = float(max_bytes), clock()

    def open(self, session_id: str) -> None:
        """A message was stored: its session may store `max_bytes` of objects."""
        with self._lock:
            self._left[session_id] = self.max_bytes
            while len(self._left) > self.kept:
                self._left.popitem(last=False)

    def charge(self, session_id: str, nbytes: int) -> str | None:
        """Count an object's bytes against its session (or the shared allowance of sessions not held); why it may
        not be stored, or None."""
        with self._lock:
            left = self._left.get(session_id)
            if left is None:
                return self._charge_unknown(nbytes)
            if nbytes > left:
                bound = f"objects of more than {self.max_bytes} bytes for one message"
                return f"{bound} (pflower-superlink --max-message-bytes)"
            self._left[session_id] = left - nbytes
            return None

    def _charge_unknown(self, nbytes: int) -> str | None:
        now = self.clock()
        refill = (now - self._spare_at) / UNKNOWN_REFILL_S * self.max_bytes
        self._spare, self._spare_at = min(float(self.max_bytes), self._spare + refill), now
        if nbytes > self._spare:
            return (
                f"objects of sessions this SuperLink no longer tracks past {self.max_bytes} bytes in "
                f"{UNKNOWN_REFILL_S:.0f} s (pflower-superlink --max-message-bytes)"
            )
        self._spare -= nbytes
        return None


def guarded(
    push_messages: Callable[..., Any], push_object: Callable[..., Any], bounds: LinkBounds
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """Flower's two Fleet handlers, each refusing (Flower's 400 'invalid payload' error, and a log line naming the
    node) what passes the bounds before the original stores anything."""
    from flwr.supercore import log
    from flwr.supercore.error import ApiErrorCode, FlowerError

    ledger = SessionLedger(bounds.max_bytes)

    def refuse(node_id: int, why: str) -> FlowerError:
        log(WARNING, "[pflower-superlink] push from node %s refused: %s", node_id, why)
        return FlowerError(ApiErrorCode.INVALID_PROTOBUF_PAYLOAD, f"node {node_id}: {why}", public_details=why)

    def bounded_push_messages(request: Any, state: Any) -> Any:
        why = message_refusal(request, bounds)
        if why is not None:
            raise refuse(request.node.node_id, why)
        response = push_messages(request=request, state=state)
        ledger.open(response.session_id)
        return response

    def bounded_push_object(request: Any, state: Any) -> Any:
        why = ledger.charge(request.session_id, len(request.object_content))
        if why is not None:
            raise refuse(request.node.node_id, why)
        return push_object(request=request, state=state)

    bounded_push_messages.__wrapped__ = push_messages  # type: ignore[attr-defined]
    bounded_push_object.__wrapped__ = push_object  # type: ignore[attr-defined]
    return bounded_push_messages, bounded_push_object


def install(bounds: LinkBounds) -> None:
    """Replace Flower's Fleet handlers in this process with the bounded ones (once)."""
    from flwr.superlink.servicer.fleet import fleet_handlers

    if hasattr(fleet_handlers.push_messages, "__wrapped__"):
        return
    fleet_handlers.push_messages, fleet_handlers.push_object = guarded(
        fleet_handlers.push_messages, fleet_handlers.push_object, bounds
    )


def patient_store(timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> None:
    """Every SQLite connection the SuperLink opens from now on waits `timeout_ms` for a lock (PRAGMA busy_timeout),
    Flower's other pragmas kept."""
    from flwr.supercore import sql_mixin

    pragmas = tuple(
        (name, str(timeout_ms) if name == "busy_timeout" else value) for name, value in sql_mixin.SQLITE_PRAGMAS
    )
    vars(sql_mixin)["SQLITE_PRAGMAS"] = pragmas  # the global that each new connection's pragma hook reads


def parse(argv: list[str]) -> tuple[LinkBounds, list[str]]:
    """This command's own options, and the rest for flower-superlink."""
    parser = argparse.ArgumentParser(
        prog="pflower-superlink",
        description="Flower's flower-superlink (give its arguments as usual) with a bound on what one SuperNode's "
        "message may make it store",
        add_help=False,  # --help prints these options, then flower-superlink's
    )
    parser.add_argument(
        "--max-message-objects",
        type=int,
        default=DEFAULT_MAX_OBJECTS,
        help=f"objects in one message's tree (default {DEFAULT_MAX_OBJECTS})",
    )
    parser.add_argument(
        "--max-message-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        help=f"bytes of one message's objects (default {DEFAULT_MAX_BYTES})",
    )
    ours, rest = parser.parse_known_args(argv)
    if {"-h", "--help"} & set(rest):
        parser.print_help()
        print("\nflower-superlink's own options follow.\n")
    elif ours.max_message_objects < 1 or ours.max_message_bytes < 1:
        parser.error("--max-message-objects and --max-message-bytes are positive integers")
    return LinkBounds(ours.max_message_objects, ours.max_message_bytes), rest


def main() -> None:
    """The `pflower-superlink` command."""
    bounds, rest = parse(sys.argv[1:])
    install(bounds)
    patient_store()
    executor_watch.install()
    from flwr.superlink.cli import flower_superlink

    sys.argv = ["flower-superlink", *rest]
    flower_superlink()
