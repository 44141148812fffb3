"""Crash-safe state files: pack/unpack, pickle refused, atomic replace, the client's state-dir versions; signatures
bound to a context; key files made where hard links are not supported; tests keep keys out of $HOME."""

from __future__ import annotations

import errno
import io
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

import client_app.state as client_state
import common.storage.persist as persist
import server_app.checkpoint as server_checkpoint
from client_app.state import ClientState, StateDir, StateDirStore, Tree
from common.storage.persist import (
    StateFileError,
    atomic_write_bytes,
    load_tree,
    pack,
    save_tree,
    signing_context,
    signing_key,
    unpack,
)
from server_app.checkpoint import server_key_file


def test_nested_state_round_trips_exactly(tmp_path) -> None:
    tree = {
        "global": [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(2, np.float64)],
        "masks": {"conv.weight": np.array([True, False, True])},
        "version": 7,
        "name": "x",
        "none": None,
        "ratio": 0.25,
        "ids": [1, 2, 3],
    }
    save_tree(tmp_path / "s.npz", tree)
    back = load_tree(tmp_path / "s.npz")
    assert back["version"] == 7 and back["name"] == "x" and back["none"] is None and back["ids"] == [1, 2, 3]
    assert back["global"][0].dtype == np.float32 and np.array_equal(back["global"][0], tree["global"][0])
    assert back["masks"]["conv.weight"].dtype == bool and back["masks"]["conv.weight"].tolist() == [True, False, True]
    assert unpack(pack(tree))["ratio"] == 0.25


def test_object_arrays_are_neither_stored_nor_loaded(tmp_path) -> None:
    with pytest.raises(TypeError):
        pack({"bad": np.array([object()], dtype=object)})
    buffer = io.BytesIO()
    np.savez(buffer, __meta__=np.frombuffer(b'{"__array__": "a0"}', np.uint8), a0=np.array([{"x": 1}], dtype=object))
    (tmp_path / "evil.npz").write_bytes(buffer.getvalue())
    with pytest.raises(StateFileError, match="evil.npz"):
        load_tree(tmp_path / "evil.npz")


def test_truncated_or_garbage_file_is_a_clear_error(tmp_path) -> None:
    save_tree(tmp_path / "s.npz", {"a": np.zeros(100)})
    data = (tmp_path / "s.npz").read_bytes()
    (tmp_path / "s.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(StateFileError, match="not a readable state file"):
        load_tree(tmp_path / "s.npz")
    (tmp_path / "p.npz").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(StateFileError):
        load_tree(tmp_path / "p.npz")


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch) -> None:
    target = tmp_path / "state.npz"
    atomic_write_bytes(target, b"old")

    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["state.npz"]


def _record(value: float) -> Tree:
    state = ClientState()
    state.save_arrays("personal", [np.full(3, value, np.float32)])
    state.save_named("mask", {"w": np.array([True, False])})
    return state.tree


def _value(record: Tree) -> float:
    return float(ClientState(record).load_arrays("personal")[0][0])


def test_state_dir_reads_the_version_a_message_needs(tmp_path) -> None:
    store = StateDir(tmp_path / "p0", run="run-a", partition=0)
    assert store.load(1, training=True) is None
    for rnd in (1, 3):
        store.save(rnd, _record(rnd), checkpoint_round=rnd - 1)
    version, record = store.load(3, training=True)  # training in round 3 starts from what round 1 left
    assert version == 1 and _value(record) == 1.0
    assert ClientState(record).load_named("mask")["w"].tolist() == [True, False]
    store.save(3, _record(3), checkpoint_round=2)
    assert store.load(3, training=False)[0] == 3  # evaluation after training in round 3 sees it


def test_versions_from_a_rolled_back_future_are_dropped(tmp_path) -> None:
    store = StateDir(tmp_path / "p0", run="run-a", partition=0)
    for rnd in (2, 5, 6):
        store.save(rnd, _record(rnd), checkpoint_round=rnd - 1)
    # the server crashed in round 6 and resumed after round 5: round 6 runs again from round 5's state
    version, record = store.load(6, training=True)
    assert version == 5 and _value(record) == 5.0 and store.versions() == [5]


def test_rollback_over_several_rounds_finds_the_state_at_the_checkpoint(tmp_path) -> None:
    store = StateDir(tmp_path / "p0", run="run-a", partition=0)
    for rnd in (2, 5, 6):
        store.save(rnd, _record(rnd), checkpoint_round=4 if rnd > 4 else 0)  # checkpoint-every 4
    assert store.versions() == [2, 5, 6]
    version, record = store.load(5, training=True)  # resumed after round 4
    assert version == 2 and _value(record) == 2.0 and store.versions() == [2]
    assert store.load(4, training=False)[0] == 2


def test_saving_keeps_only_what_a_resume_can_need(tmp_path) -> None:
    store = StateDir(tmp_path / "p0", run="run-a", partition=0)
    for rnd in (1, 2, 3, 4):
        store.save(rnd, _record(rnd), checkpoint_round=2)
    assert store.versions() == [2, 3, 4]  # newest at or before the checkpoint, and everything after it
    store.save(5, _record(5), checkpoint_round=None)
    assert store.versions() == [5]  # no checkpoints: the newest is all a restart needs


def test_unreadable_newest_version_is_refused_not_replaced_by_an_older_one(tmp_path) -> None:
    store = StateDir(tmp_path / "p0", run="run-a", partition=0)
    store.save(1, _record(1), checkpoint_round=0)
    store.save(2, _record(2), checkpoint_round=0)
    (tmp_path / "p0" / "round-000002.npz").write_bytes(b"torn")
    with pytest.raises(StateFileError, match="round-000002.npz: refused: it has no signature"):
        store.load(3, training=True)
    assert store.versions() == [1, 2]  # nothing deleted: the files stay for a look


def test_memory_mapped_arrays_are_streamed_and_can_be_mapped_back(tmp_path) -> None:
    """A memmap is written row block by row block; np.load reads the file like np.savez's; load_tree maps arrays from
    `map_from_bytes` on, copy-on-write (writing to the mapped copy leaves the file as it was)."""
    store = np.lib.format.open_memmap(tmp_path / "store.npy", mode="w+", dtype=np.float32, shape=(300, 1000))
    store[:] = np.arange(300 * 1000, dtype=np.float32).reshape(300, 1000)
    small = np.arange(5, dtype=np.int64)
    save_tree(tmp_path / "state.npz", {"W": store, "small": small, "n": 3})
    reference = tmp_path / "reference.npz"
    np.savez(reference, allow_pickle=False, **pack({"W": np.asarray(store), "small": small, "n": 3}))
    with np.load(tmp_path / "state.npz") as ours, np.load(reference) as theirs:
        assert ours.files == theirs.files
        for key in ours.files:
            assert np.array_equal(ours[key], theirs[key])
    mapped = load_tree(tmp_path / "state.npz", map_from_bytes=1 << 20)
    assert isinstance(mapped["W"], np.memmap) and not isinstance(mapped["small"], np.memmap) and mapped["n"] == 3
    assert np.array_equal(mapped["W"], store)
    mapped["W"][0, 0] = -1.0
    assert load_tree(tmp_path / "state.npz")["W"][0, 0] == 0.0
    plain = load_tree(tmp_path / "state.npz")
    assert not isinstance(plain["W"], np.memmap) and np.array_equal(plain["W"], store)


def test_a_signature_binds_the_file_to_its_context(tmp_path: Path) -> None:
    key, path = os.urandom(32), tmp_path / "s.npz"
    save_tree(path, {"a": np.arange(3)}, key=key, context=signing_context("client-state", "run-a", 0, 5))
    assert load_tree(path, key=key, context=signing_context("client-state", "run-a", 0, 5))["a"].tolist() == [0, 1, 2]
    for other in (signing_context("client-state", "run-a", 1, 5), signing_context("client-state", "run-a", 0, 3), b""):
        with pytest.raises(StateFileError, match="s.npz: refused: its signature does not match .*moved"):
            load_tree(path, key=key, context=other)


def test_context_parts_cannot_run_into_each_other() -> None:
    assert signing_context("client-state", "run-1", 23) != signing_context("client-state", "run-12", 3)
    assert signing_context("a", "1") != signing_context("a", 1)


@pytest.mark.parametrize("code", [errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV])
def test_a_key_is_made_where_hard_links_are_not_supported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    def no_links(src: object, dst: object) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "link", no_links)  # as on FAT or an SMB share
    key_file = tmp_path / "keys" / "server.key"
    key = signing_key(key_file)
    assert len(key) == 32 and signing_key(key_file) == key
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in key_file.parent.iterdir()] == ["server.key"]  # no temporary file left behind


def test_without_hard_links_a_key_made_meanwhile_by_another_process_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "keys" / "server.key"
    theirs = os.urandom(32)

    def other_process_first(src: object, dst: object) -> None:
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, theirs)
        os.close(fd)
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", other_process_first)
    assert signing_key(key_file) == theirs


def test_other_link_errors_still_stop_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_space(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", no_space)
    with pytest.raises(StateFileError, match="server.key: cannot create the key file .*No space left"):
        signing_key(tmp_path / "server.key")
    assert list(tmp_path.iterdir()) == []


def test_tests_keep_the_server_key_out_of_the_home_folder(tmp_path_factory: pytest.TempPathFactory) -> None:
    key_file = server_key_file()
    assert key_file.is_relative_to(tmp_path_factory.getbasetemp())
    assert os.environ["PFL_KEY_DIR"] == str(key_file.parent)  # os.environ: the processes tests start inherit it


def _count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(persist.os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    return calls


def test_a_state_written_not_durable_is_complete_signed_and_never_fsynced(tmp_path, monkeypatch) -> None:
    store = StateDir(tmp_path / "state" / "partition-1", run="r", partition=1)
    signing_key(store.key_file)  # made once, durably, on first use
    fsyncs = _count_fsyncs(monkeypatch)
    tree: Tree = {"w": {"0": np.arange(5, dtype=np.float32)}}
    store.save(3, tree, None, durable=False)
    assert fsyncs == []
    loaded = store.load(4, training=True)
    assert loaded is not None and loaded[0] == 3
    np.testing.assert_array_equal(loaded[1]["w"]["0"], tree["w"]["0"])
    store.save(4, tree, None)  # durable (a device's): the file and its folder's rename
    assert len(fsyncs) >= 2


def test_a_simulations_clients_leave_the_fsync_to_the_servers_barrier(tmp_path, monkeypatch) -> None:
    folder = StateDir(tmp_path / "partition-0", run="r", partition=0)
    signing_key(folder.key_file)
    fsyncs = _count_fsyncs(monkeypatch)
    state = ClientState({"w": {"0": np.ones(3, dtype=np.float32)}})
    monkeypatch.setattr(client_state, "_answers_for_many_clients", lambda: True)
    StateDirStore(folder).persist(state, 1, None, due=True)
    assert fsyncs == []
    monkeypatch.setattr(client_state, "_answers_for_many_clients", lambda: False)  # a device
    StateDirStore(folder).persist(state, 2, None, due=False)
    assert fsyncs, "a device's state is on disk before it replies"


def test_the_barrier_runs_after_the_runtime_wrote_its_states(tmp_path, monkeypatch) -> None:
    order: list[str] = []
    monkeypatch.setattr(server_checkpoint, "sync_file_system", lambda path: order.append(f"sync {Path(path).name}"))
    step = server_checkpoint.synced_client_states(lambda rnd: order.append(f"persist {rnd}"), tmp_path / "run")
    step(4)
    assert order == ["persist 4", "sync run"]


def test_sync_file_system_falls_back_to_a_sync_of_everything(tmp_path, monkeypatch) -> None:
    synced: list[bool] = []
    monkeypatch.setattr(persist.os, "sync", lambda: synced.append(True))
    persist.sync_file_system(tmp_path)  # syncfs of the folder's file system: no fallback
    assert synced == []
    persist.sync_file_system(tmp_path / "missing")
    assert synced == [True]


@pytest.mark.parametrize("mapped", [False, True])
def test_a_signed_file_changed_after_its_check_is_decoded_as_verified(tmp_path, monkeypatch, mapped: bool) -> None:
    """Found by an attack pass: the signature was checked on the file, then the arrays were read (or mapped) from it
    again, so the same user could change weights in between. Now the bytes checked are the bytes decoded."""
    path, key = tmp_path / "state.npz", b"k" * 32
    weights = np.arange(4096, dtype=np.float32)
    persist.save_tree(path, {"w": weights}, key=key, context=b"ctx")
    real = persist._verified_copy

    def then_tampered(*args, **kwargs):  # type: ignore[no-untyped-def]
        copy = real(*args, **kwargs)
        data = bytearray(path.read_bytes())
        start = data.index(weights.tobytes()[:64])
        data[start : start + 4] = np.float32(1e9).tobytes()
        with open(path, "r+b") as fh:  # in place, as another process of the same user would
            fh.write(data)
        return copy

    monkeypatch.setattr(persist, "_verified_copy", then_tampered)
    back = persist.load_tree(path, map_from_bytes=1024 if mapped else None, key=key, context=b"ctx")
    assert isinstance(back["w"], np.memmap) == mapped
    np.testing.assert_array_equal(np.asarray(back["w"]), weights)
    with pytest.raises(persist.StateFileError, match="signature does not match"):
        persist.load_tree(path, key=key, context=b"ctx")  # the changed file itself is refused


def test_a_full_disk_while_copying_a_signed_file_says_so(tmp_path, monkeypatch) -> None:
    """A signed file whose arrays are mapped is first copied privately beside it; a full disk says that, not
    'not a readable state file ([Errno 28] ...)'."""
    path, key = tmp_path / "state.npz", b"k" * 32
    persist.save_tree(path, {"w": np.arange(4096, dtype=np.float32)}, key=key)

    class Full(io.BytesIO):
        def write(self, data):  # type: ignore[no-untyped-def, override]
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(persist.tempfile, "TemporaryFile", lambda **kwargs: Full())
    with pytest.raises(persist.StateFileError, match="no space left in .* for its private copy"):
        persist.load_tree(path, map_from_bytes=1024, key=key)
