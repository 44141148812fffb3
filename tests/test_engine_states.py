"""Client state kept by the in-process engine between a node's messages (experiments/engine/states.py): exact
round trips through shared memory, blocks freed, the memory budget spilling to the state dirs, checkpoints."""

from __future__ import annotations

import logging
import os
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest

from client_app.state import Kept, StateDir, Tree
from experiments.engine.blobs import drop
from experiments.engine.states import HeldStates, StateBlock, pack, unpack


def _tree(value: float) -> Tree:
    return {
        "personal": {"0": np.full((3, 5), value, np.float32), "1": np.arange(7, dtype=np.int64)},
        "masks": {"w": np.array([[True, False, True]]), "count": np.array(5, np.int64)},  # a 0-d array
        "empty": {"e": np.zeros((0, 4), np.float32)},
        "alpha": {"alpha": np.array([value], np.float64)},
    }


def _kept(tmp_path: Path, value: float, server_round: int, pid: int = 0, on_disk: bool = True) -> Kept:
    store = StateDir(tmp_path / "run" / f"partition-{pid}", run="run", partition=pid) if on_disk else None
    return Kept(server_round, _tree(value), 0, store, dirty=True)


def _exists(block: StateBlock) -> bool:
    assert block.ref is not None
    try:
        shared_memory.SharedMemory(name=block.ref.name).close()
    except FileNotFoundError:
        return False
    return True


def _same(a: Tree, b: Tree) -> bool:
    return a.keys() == b.keys() and all(
        a[k].keys() == b[k].keys()
        and all(
            x.dtype == b[k][n].dtype and x.shape == b[k][n].shape and np.array_equal(x, b[k][n])
            for n, x in a[k].items()
        )
        for k in a
    )


def test_a_state_crosses_a_block_exactly_with_every_dtype_and_shape(tmp_path: Path) -> None:
    held = HeldStates(limit=1 << 30)
    block = pack(_kept(tmp_path, 2.5, server_round=4))
    held.put(7, block)
    back = unpack(block)
    assert _same(back.tree, _tree(2.5)) and back.server_round == 4 and back.dirty
    assert back.store is not None and back.store.path == tmp_path / "run" / "partition-0"
    held.close()
    assert not _exists(block)


def test_a_new_state_frees_the_old_block(tmp_path: Path) -> None:
    held = HeldStates(limit=1 << 30)
    first, second = pack(_kept(tmp_path, 1.0, 1)), pack(_kept(tmp_path, 2.0, 2))
    held.put(3, first)
    held.put(3, second)
    assert not _exists(first) and _exists(second) and held.get(3) == second
    assert held.held_bytes == second.ref.size  # type: ignore[union-attr]
    held.close()


def _size(kept: Kept) -> int:
    block = pack(kept)
    assert block.ref is not None
    drop(block.ref)
    return block.ref.size


def test_over_the_budget_the_least_recently_used_idle_states_go_to_their_state_dirs(tmp_path: Path) -> None:
    size = _size(_kept(tmp_path, 0.0, 1))
    held = HeldStates(limit=2 * size)
    blocks = {pid: pack(_kept(tmp_path, float(pid), 1, pid)) for pid in range(4)}
    held.put(0, blocks[0])
    held.put(1, blocks[1])
    held.get(0)  # node 0 used again: node 1 is now the least recently used
    held.put(2, blocks[2], busy={1})  # node 1 has a message in flight: its block must stay
    assert held.get(1) is not None and held.get(0) is None and not _exists(blocks[0])
    loaded = StateDir(tmp_path / "run" / "partition-0", run="run", partition=0).load(2, training=True)
    assert loaded is not None and loaded[0] == 1 and _same(loaded[1], _tree(0.0))
    held.put(3, blocks[3])
    assert held.held_bytes <= 2 * size and held.written == 2
    held.close()


def test_memory_only_states_are_never_spilled(tmp_path: Path) -> None:
    size = _size(_kept(tmp_path, 0.0, 1, on_disk=False))
    held = HeldStates(limit=size)
    held.put(0, pack(_kept(tmp_path, 0.0, 1, on_disk=False)))
    held.put(1, pack(_kept(tmp_path, 1.0, 1, on_disk=False)))
    assert held.get(0) is not None and held.get(1) is not None and held.written == 0
    held.close()


def test_a_checkpoint_writes_each_changed_state_once(tmp_path: Path) -> None:
    held = HeldStates(limit=1 << 30)
    held.put(0, pack(_kept(tmp_path, 1.0, 3, pid=0)))
    held.put(1, pack(_kept(tmp_path, 2.0, 2, pid=1)))
    held.write_all(checkpoint_round=0)
    held.write_all(checkpoint_round=0)
    assert held.written == 2
    assert StateDir(tmp_path / "run" / "partition-0", run="run", partition=0).versions() == [3]
    assert StateDir(tmp_path / "run" / "partition-1", run="run", partition=1).versions() == [2]
    clean = held.get(0)
    assert clean is not None and not clean.dirty and _exists(clean)  # still held: the next message reads no file
    held.close()


@pytest.mark.parametrize(("training", "checkpoint_every"), [(True, 0), (False, 0), (True, 5), (True, 2)])
def test_the_client_app_starts_from_the_engines_copy_and_leaves_its_change_there(
    tmp_path: Path, training: bool, checkpoint_every: int
) -> None:
    """Round 5's change stays with the engine, and reaches the state dir at once when round 5 is checkpointed."""
    from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from client_app import app as client
    from client_app.state import RuntimeStore, StateHost, host_state

    for name in ("run_id", "node_id", "task_id"):
        setattr(TaskIdentity, name, 1)

    class _Context:
        run_config = {
            "dataset": "digits",
            "client-state-dir": str(tmp_path / "states"),
            "checkpoint-every": checkpoint_every,
            "num-rounds": 20,
        }
        node_config = {"partition-id": 0, "num-partitions": 2}
        state = RecordDict()

    checkpointed = checkpoint_every > 0 and 5 % checkpoint_every == 0
    config = ConfigRecord({"server-round": 5, "state-key": "run-a"})
    kind = MessageType.TRAIN if training else MessageType.EVALUATE
    msg = Message(RecordDict({"config": config}), dst_node_id=1, message_type=kind)
    host = StateHost()
    host_state(host)
    try:
        host.begin(Kept(4, _tree(1.5), 0, None, dirty=False))
        env, store = client._env(_Context(), msg, training=training)  # type: ignore[arg-type]
        assert _same(env.state.tree, _tree(1.5))
        env.state.save_named("alpha", {"alpha": np.array([9.0])})
        reply = Message(RecordDict({"metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)
        client._persist(env, store, msg, reply)
        assert host.outgoing is not None and host.outgoing.server_round == 5
        assert reply.content.metric_records["metrics"]["state-round"] == 5, "the reply names the state it left"
        assert isinstance(store, RuntimeStore) and store.folder is not None
        assert store.folder.versions() == ([5] if checkpointed else [])
        assert host.outgoing.dirty is not checkpointed  # a state not yet in the state dir is written at the checkpoint
        assert host.incoming is not None and host.incoming.tree["alpha"]["alpha"][0] == 1.5  # the copy it came with
    finally:
        host_state(None)


def test_blocks_a_run_left_behind_are_swept_and_names_stay_in_the_shared_memory_folder() -> None:
    from experiments.engine import blobs

    kept = blobs.put(b"x" * 100)
    other = blobs.write([(3, memoryview(b"abc"))], 8)
    assert blobs.take(other, unlink=True) == b"\0\0\0abc\0\0"
    assert blobs.sweep(blobs.prefix()) >= 1 and not (blobs.SHM_DIR / kept.name).exists()
    dead = "pfl999999999-dead0001-"  # a run killed with SIGKILL: its lock file stayed, nobody holds it
    (blobs.SHM_DIR / f"{dead}{blobs.LOCK_SUFFIX}").write_bytes(b"")
    orphan = blobs.SHM_DIR / f"{dead}0123abcd"
    orphan.write_bytes(b"x")
    live = "pfl999999998-live0001-"  # a live run in another PID namespace: its PID means nothing here
    fd = blobs.hold_run_lock(live)
    in_use = blobs.SHM_DIR / f"{live}0123abcd"
    in_use.write_bytes(b"x")
    unknown = blobs.SHM_DIR / "pfl999999997-nolock01-0123abcd"  # no lock file: nothing proves it dead
    unknown.write_bytes(b"x")
    try:
        assert blobs.sweep_orphans() >= 2 and not orphan.exists()
        assert not (blobs.SHM_DIR / f"{dead}{blobs.LOCK_SUFFIX}").exists()
        assert in_use.exists() and unknown.exists()
    finally:
        blobs.release_run_lock(live, fd)
        blobs.sweep(live)
        unknown.unlink()
    for name in ("../etc/passwd", "", ".hidden", "a/b"):
        with pytest.raises(ValueError, match="not a shared-memory block name"):
            blobs.take(blobs.BlobRef(name, 1), unlink=False)


def test_an_inline_grid_leaves_the_process_as_the_server_s(tmp_path, monkeypatch) -> None:
    """After an inline grid answers a message, no client state host stays installed and the task identity is the
    server's again (tests and profiling run many inline grids in one process)."""
    from flwr.app import Message, MessageType, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    import client_app.state as client_state
    from experiments.engine.grid import InProcessGrid

    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", SUPERLINK_NODE_ID)):
        monkeypatch.setattr(TaskIdentity, name, value, raising=False)
    with InProcessGrid({"dataset": "digits", "results-dir": str(tmp_path)}, 2, workers=0) as grid:
        assert client_state.HOST is None
        (mid,) = grid.push_messages([Message(RecordDict(), 1000, MessageType.QUERY)])
        assert client_state.HOST is None, "the client state host is uninstalled after the message"
        assert TaskIdentity.node_id == SUPERLINK_NODE_ID, "the process is the server's again"
        assert [r.metadata.reply_to_message_id for r in grid.pull_messages([mid])] == [mid]


@pytest.mark.parametrize(("host", "level"), [(None, logging.INFO), (object(), logging.DEBUG)])
def test_a_restore_is_one_info_line_on_a_device_and_debug_where_a_process_answers_for_many_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: object, level: int
) -> None:
    from client_app import state

    store = StateDir(tmp_path / "run" / "partition-0", run="run", partition=0)
    store.save(1, _tree(1.0), 1)
    seen: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = seen.append  # type: ignore[method-assign]
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    before = logger.level
    logger.setLevel(logging.DEBUG)  # whatever an earlier test left
    monkeypatch.setattr(state, "HOST", host)
    monkeypatch.setattr(state, "_restored", set())
    try:
        for _ in range(2):
            assert state._load_logged(store, 2, training=True) is not None
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)
    lines = [r for r in seen if "client state restored" in r.getMessage()]
    assert [(r.levelno, r.getMessage().rsplit(" ", 2)[-2:]) for r in lines] == [(level, ["(round", "1)"])]


def test_another_users_block_with_the_engines_prefix_is_left_alone(monkeypatch) -> None:
    """A file of another user under a run's prefix (planted in the shared /dev/shm) neither stops the run at its
    end nor gets read as a run's lock."""
    from experiments.engine import blobs

    planted = blobs.SHM_DIR / "pfl999999996-other001-0123abcd"
    planted.write_bytes(b"x")
    lock = blobs.SHM_DIR / f"pfl999999996-other001-{blobs.LOCK_SUFFIX}"
    lock.write_bytes(b"")
    me = os.getuid()
    monkeypatch.setattr(blobs.os, "getuid", lambda: me + 1)  # as if those files were another user's
    try:
        assert blobs.sweep("pfl999999996-other001-") == 0
        assert blobs.sweep_orphans() == 0
        assert planted.exists() and lock.exists()
    finally:
        monkeypatch.undo()
        planted.unlink()
        lock.unlink()


def _received(values: np.ndarray) -> dict[str, np.ndarray]:
    """Arrays as a received payload decodes to them: read-only views of immutable bytes."""
    data = values.tobytes()
    return {"w": np.frombuffer(data, values.dtype).reshape(values.shape), "b": np.frombuffer(data[:64], np.int32)}


def _links(content_name: str) -> int:
    return os.stat(f"/dev/shm/{content_name}").st_nlink


def test_states_holding_the_same_received_arrays_share_one_content_block(tmp_path: Path) -> None:
    from experiments.engine.states import CONTENT_FROM_BYTES, forget_contents

    forget_contents()
    weights = np.arange(CONTENT_FROM_BYTES // 4 + 10, dtype=np.float32)
    received = _received(weights)
    held = HeldStates(limit=1 << 30)
    blocks = []
    for pid in range(3):
        kept = _kept(tmp_path, float(pid), 2, pid)
        kept.tree["global"] = received
        blocks.append(pack(kept))
        held.put(pid, blocks[-1])
    origins = {c.origin for b in blocks for c in b.contents}
    assert len(origins) == 1 and all(len(b.contents) == 1 for b in blocks)
    content_size = blocks[0].contents[0].ref.size
    assert content_size >= weights.nbytes
    assert held.held_bytes == sum(b.ref.size for b in blocks if b.ref) + content_size  # the content counted once
    for pid, block in enumerate(blocks):
        back = unpack(block)
        expected = {**_tree(float(pid)), "global": {"w": weights, "b": np.frombuffer(weights.tobytes()[:64], np.int32)}}
        assert _same(back.tree, expected)
        assert not back.tree["global"]["w"].flags.writeable
    name = blocks[0].contents[0].ref.name
    assert _links(name) == 4  # three states and the worker's own link
    held.discard(0)
    assert _links(blocks[1].contents[0].ref.name) == 3 and not os.path.exists(f"/dev/shm/{name}")
    forget_contents()
    held.close()
    assert not any(os.path.exists(f"/dev/shm/{c.ref.name}") for b in blocks for c in b.contents)
    assert held.held_bytes == 0


def test_a_state_read_by_a_worker_and_kept_again_links_the_same_content(tmp_path: Path) -> None:
    from experiments.engine.states import CONTENT_FROM_BYTES, forget_contents

    forget_contents()
    kept = _kept(tmp_path, 1.0, 1)
    kept.tree["global"] = _received(np.ones(CONTENT_FROM_BYTES // 4, np.float32))
    first = pack(kept)
    forget_contents()  # another worker: it knows the block only from the state it is handed
    again = unpack(first, share=True)
    again.tree["mine"] = {"x": np.zeros(3)}
    second = pack(again)
    assert second.contents[0].origin == first.contents[0].origin and second.contents[0].ref != first.contents[0].ref
    assert _same(unpack(second).tree, {**unpack(first).tree, "mine": {"x": np.zeros(3)}})
    held = HeldStates(limit=1 << 30)
    held.put(0, first)
    held.put(0, second)  # the old state's link freed, the content stays for the new one
    assert _same({"g": unpack(second).tree["global"]}, {"g": dict(kept.tree["global"])})
    forget_contents()
    held.close()


def test_small_or_writable_arrays_stay_in_the_state_own_block(tmp_path: Path) -> None:
    from experiments.engine.states import CONTENT_FROM_BYTES

    kept = _kept(tmp_path, 1.0, 1)
    kept.tree["small"] = _received(np.ones(16, np.float32))  # immutable but small: not worth a block
    kept.tree["writable"] = {"w": np.ones(CONTENT_FROM_BYTES, np.float32)}
    block = pack(kept)
    assert block.contents == () and _same(unpack(block).tree, kept.tree)
    assert block.ref is not None
    drop(block.ref)


def test_a_spilled_state_writes_its_shared_content_to_its_state_dir(tmp_path: Path) -> None:
    from experiments.engine.states import CONTENT_FROM_BYTES, forget_contents

    weights = np.arange(CONTENT_FROM_BYTES // 4, dtype=np.float32)
    kept = _kept(tmp_path, 3.0, 2)
    kept.tree["global"] = _received(weights)
    held = HeldStates(limit=1)
    held.put(0, pack(kept))
    held.put(1, pack(_kept(tmp_path, 4.0, 2, pid=1)))  # over the budget: node 0 goes to disk
    assert held.get(0) is None and held.written == 1
    loaded = StateDir(tmp_path / "run" / "partition-0", run="run", partition=0).load(3, training=True)
    assert loaded is not None and np.array_equal(loaded[1]["global"]["w"], weights)
    forget_contents()
    held.close()


def test_saving_keeps_immutable_views_as_they_are_and_copies_the_rest() -> None:
    from client_app.state import ClientState, immutable_root

    received = _received(np.arange(8, dtype=np.float32))["w"]
    mine = np.arange(8, dtype=np.float32)
    writable_view_made_read_only = mine.view()
    writable_view_made_read_only.flags.writeable = False  # its base can still change: not immutable
    assert immutable_root(received) is not None and immutable_root(writable_view_made_read_only) is None
    state = ClientState()
    state.save_named("k", {"received": received, "mine": writable_view_made_read_only})
    mine[:] = -1
    assert state.tree["k"]["received"] is received
    assert np.array_equal(state.tree["k"]["mine"], np.arange(8, dtype=np.float32))
