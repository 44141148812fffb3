"""The SuperLink's per-message store bound (server_app/linkguard.py): a pushed tree of too many objects, or objects
of too many bytes for one message, is refused before Flower's handler stores anything."""

from __future__ import annotations

import pytest
from flwr.proto.fleet_pb2 import PushMessagesRequest, PushMessagesResponse
from flwr.proto.message_pb2 import ObjectTree, PushObjectRequest, PushObjectResponse
from flwr.supercore.error import FlowerError

from server_app import linkguard
from server_app.linkguard import LinkBounds, count_objects, guarded, message_refusal


def tree(children: int, depth: int = 1) -> ObjectTree:
    """A root with `children` leaves, or a chain `depth` long."""
    if depth > 1:
        return ObjectTree(object_id=f"{depth:064x}", children=[tree(children, depth - 1)])
    return ObjectTree(object_id="f" * 64, children=[ObjectTree(object_id=f"{i:064x}") for i in range(children)])


def push(t: ObjectTree, messages: int = 1) -> PushMessagesRequest:
    request = PushMessagesRequest(message_object_trees=[t])
    request.node.node_id = 66
    for _ in range(messages):
        request.messages_list.add()
    return request


class Store:
    """Flower's handlers as the guard sees them: they record what reached them."""

    def __init__(self) -> None:
        self.messages: list[PushMessagesRequest] = []
        self.objects: list[bytes] = []

    def push_messages(self, request, state):
        self.messages.append(request)
        return PushMessagesResponse(session_id=f"s{len(self.messages)}")

    def push_object(self, request, state):
        self.objects.append(request.object_content)
        return PushObjectResponse(stored=True)


def test_objects_are_counted_up_to_the_bound_only() -> None:
    assert count_objects(tree(3), 10) == 4 and count_objects(tree(0, depth=5), 10) == 5
    assert count_objects(tree(80_000), 4096) == 4097, "the count stops past the bound"


def test_the_80000_object_tree_under_nginxs_bound_is_refused_before_it_is_stored(caplog) -> None:
    request = push(tree(80_000))
    assert request.ByteSize() < 6 << 20, "one request under the proxy's 6 MiB bound"
    store = Store()
    push_messages, _ = guarded(store.push_messages, store.push_object, LinkBounds())
    with pytest.raises(FlowerError, match="more than 4096 objects"):
        push_messages(request=request, state=None)
    assert store.messages == [], "nothing reached Flower's store"
    assert "push from node 66 refused: an object tree of more than 4096 objects" in caplog.text
    assert message_refusal(push(tree(3), messages=2), LinkBounds()) is not None, "one message per push"
    ok = push(tree(40))
    assert push_messages(request=ok, state=None).session_id == "s1" and store.messages == [ok]


def test_a_messages_objects_past_its_byte_bound_are_refused() -> None:
    store = Store()
    push_messages, push_object = guarded(store.push_messages, store.push_object, LinkBounds(max_bytes=100))
    session = push_messages(request=push(tree(5)), state=None).session_id

    def send(content: bytes, session_id: str = session) -> PushObjectResponse:
        request = PushObjectRequest(session_id=session_id, object_content=content)
        request.node.node_id = 66
        return push_object(request=request, state=None)

    assert send(b"x" * 60).stored and send(b"x" * 40).stored
    with pytest.raises(FlowerError, match="more than 100 bytes for one message"):
        send(b"x")
    assert sum(map(len, store.objects)) == 100, "the refused object was not stored"
    other = push_messages(request=push(tree(5)), state=None).session_id
    assert send(b"x" * 100, other).stored, "each message has its own budget"
    assert send(b"y", "unknown").stored, "an unknown session is left to Flower (it stores only registered objects)"


def test_a_forgotten_session_shares_a_bounded_allowance_instead_of_none() -> None:
    """Found by an attack pass: the ledger kept the newest 100,000 sessions and let any other one store without a
    limit, so a device that opened 100,000 sessions could push an old one's objects unbounded. Forgotten and
    unknown sessions now share one allowance of max_bytes per minute."""
    now = [0.0]
    ledger = linkguard.SessionLedger(max_bytes=10, kept=2, clock=lambda: now[0])
    for session in ("a", "b", "c"):
        ledger.open(session)  # "a" is forgotten
    assert ledger.charge("c", 11) is not None, "a held session keeps its own bound"
    assert ledger.charge("a", 6) is None and ledger.charge("never-opened", 4) is None
    assert "no longer tracks" in str(ledger.charge("a", 1)), "the shared allowance is spent"
    now[0] += linkguard.UNKNOWN_REFILL_S / 2
    assert ledger.charge("a", 5) is None and ledger.charge("a", 1) is not None, "half refilled after half the time"
    now[0] += 10 * linkguard.UNKNOWN_REFILL_S
    assert ledger.charge("a", 11) is not None and ledger.charge("a", 10) is None, "never above max_bytes"


def test_the_command_installs_the_guard_on_flowers_fleet_handlers(monkeypatch) -> None:
    from flwr.superlink.servicer.fleet import fleet_handlers

    monkeypatch.setattr(fleet_handlers, "push_messages", fleet_handlers.push_messages)
    monkeypatch.setattr(fleet_handlers, "push_object", fleet_handlers.push_object)
    original = fleet_handlers.push_messages
    bounds, rest = linkguard.parse(["--max-message-objects", "10", "--database", "x.db", "--insecure"])
    assert bounds == LinkBounds(10, linkguard.DEFAULT_MAX_BYTES) and rest == ["--database", "x.db", "--insecure"]
    linkguard.install(bounds)
    assert fleet_handlers.push_messages.__wrapped__ is original
    with pytest.raises(FlowerError):
        fleet_handlers.push_messages(request=push(tree(20)), state=None)
    linkguard.install(bounds)
    assert fleet_handlers.push_messages.__wrapped__ is original, "installed once"
    with pytest.raises(SystemExit):
        linkguard.parse(["--max-message-bytes", "0"])


def test_the_superlinks_store_waits_a_minute_for_a_lock_not_five_seconds(monkeypatch) -> None:
    """Under load Flower's 5 s busy timeout turned waits for the store's write lock into HTTP 500s that ended a
    ServerApp and the SuperLink's ServerApp executor; `pflower-superlink` raises it, keeping Flower's other pragmas."""
    import sqlite3

    from flwr.supercore import sql_mixin

    from server_app.linkguard import SQLITE_BUSY_TIMEOUT_MS, patient_store

    flowers = dict(sql_mixin.SQLITE_PRAGMAS)
    monkeypatch.setattr(sql_mixin, "SQLITE_PRAGMAS", sql_mixin.SQLITE_PRAGMAS)  # restored after the test

    def busy_timeout() -> int:
        connection = sqlite3.connect(":memory:")
        sql_mixin._set_sqlite_pragmas(connection, None)
        (value,) = connection.execute("PRAGMA busy_timeout").fetchone()
        connection.close()
        return int(value)

    assert busy_timeout() == int(flowers["busy_timeout"]) == 5000, "Flower's own, as checked with Flower 1.42"
    patient_store()
    assert busy_timeout() == SQLITE_BUSY_TIMEOUT_MS == 60_000
    assert {k: v for k, v in sql_mixin.SQLITE_PRAGMAS if k != "busy_timeout"} == {
        k: v for k, v in flowers.items() if k != "busy_timeout"
    }
