"""The adapter to Flower's internals (server_app/flower_private.py): what it writes is what Flower reads, and the
attributes and signatures it relies on are Flower's, so a Flower release that changes them fails here."""

from __future__ import annotations

import inspect

import flwr
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
from flwr.supercore.task_identity import TaskIdentity

from server_app.flower_private import (
    PATCHED_VERSION,
    PRIVATE_FIELDS,
    SIMULATION_GRID,
    fast_get_message_ins,
    indexed_store_message_ins,
    is_simulation,
    set_task_identity,
    speed_up_simulation,
    stamp,
)


def test_the_task_identity_set_is_the_one_flower_reads() -> None:
    set_task_identity(7, 3, 9)
    assert (TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id) == (7, 3, 9)


def test_the_private_message_fields_stamped_are_the_ones_metadata_reads() -> None:
    set_task_identity(1, 1, 1)
    message = Message(
        RecordDict({"config": ConfigRecord({"server-round": 0})}), dst_node_id=5, message_type=MessageType.QUERY
    )
    assert set(PRIVATE_FIELDS) <= set(message.metadata.__dict__), "Flower renamed Metadata's private fields"
    stamp(message, "m-1", run_id=7, src_node_id=3)
    assert (message.metadata.message_id, message.metadata.run_id, message.metadata.src_node_id) == ("m-1", 7, 3)
    reply = stamp(Message(RecordDict(), reply_to=message), "r-1")
    assert reply.metadata.message_id == "r-1" and reply.metadata.reply_to_message_id == "m-1"
    assert reply.metadata.run_id == 7  # a reply takes the run from the message it answers


def test_the_link_state_has_what_the_speedup_relies_on() -> None:
    """Its lock, its message store, and the two methods' signatures (the speed-up wraps them as they are)."""
    get = inspect.signature(InMemoryLinkState.get_message_ins).parameters
    assert list(get)[:3] == ["self", "node_id", "limit"] and get["run_id"].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(inspect.signature(InMemoryLinkState.store_message_ins).parameters) == ["self", "message"]
    source = inspect.getsource(InMemoryLinkState.__init__)
    assert "self.lock" in source and "self.message_ins_store" in source


class _Metadata:
    def __init__(self, dst: int, delivered: str = "") -> None:
        self.dst_node_id, self.delivered_at = dst, delivered


class _Msg:
    def __init__(self, dst: int, delivered: str = "") -> None:
        self.metadata = _Metadata(dst, delivered)


class _State:
    def __init__(self, messages: list[_Msg]) -> None:
        import threading

        self.lock = threading.RLock()
        self.message_ins_store = {str(i): m for i, m in enumerate(messages)}


def test_the_simulation_speedup_asks_flower_only_for_nodes_with_a_waiting_message() -> None:
    asked: list[int] = []

    def original(state, node_id, limit, *, run_id=None):
        asked.append(node_id)
        found = [
            m
            for m in state.message_ins_store.values()
            if m.metadata.dst_node_id == node_id and not m.metadata.delivered_at
        ][:limit]
        for m in found:
            m.metadata.delivered_at = "now"
        return found

    def store(state, message):
        key = str(len(state.message_ins_store))
        state.message_ins_store[key] = message
        return key

    fast = fast_get_message_ins(original)
    state = _State([_Msg(1), _Msg(2, delivered="2026-01-01"), _Msg(3)])
    assert fast(state, 1, 1) == [state.message_ins_store["0"]]
    assert fast(state, 2, 1) == [] and fast(state, 4, 1) == []  # delivered already / nothing for the node
    assert fast(state, 3, 1, run_id=7) == [state.message_ins_store["2"]]
    assert asked == [1, 3]
    assert fast(state, 1, 1) == [] and fast(state, 1, 1) == [] and asked == [1, 3, 1], "asked once, then known empty"
    late = _Msg(1)
    assert indexed_store_message_ins(store)(state, late) == "3"  # a new message for node 1 puts it back
    assert fast(state, 1, 1) == [late] and fast(state, 4, 1) == [] and asked == [1, 3, 1, 1]


def test_the_speedup_is_installed_once_for_the_flower_version_it_was_written_for() -> None:
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    if flwr.__version__ != PATCHED_VERSION:
        assert not speed_up_simulation()
        return
    assert speed_up_simulation() and speed_up_simulation()
    method = InMemoryLinkState.get_message_ins
    assert hasattr(method, "__wrapped__") and not hasattr(method.__wrapped__, "__wrapped__")


def test_the_runtime_is_told_from_the_grid_flower_hands_over() -> None:
    """Flower's simulation and the in-process engine are simulations; a SuperLink's grid is a deployment."""
    import importlib

    from flwr.superlink.grid import HttpGrid, InMemoryGrid

    from experiments.engine.grid import InProcessGrid

    assert (InMemoryGrid.__module__, InMemoryGrid.__name__) == SIMULATION_GRID, "Flower moved its simulation's grid"
    importlib.import_module(SIMULATION_GRID[0])
    assert is_simulation(object.__new__(InMemoryGrid)) and is_simulation(object.__new__(InProcessGrid))
    assert not is_simulation(object.__new__(HttpGrid)) and not is_simulation(object())
