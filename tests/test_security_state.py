"""Signed state files: a server checkpoint or a client's stored state that was changed on disk (even consistently,
even re-signed with another key) or moved (another partition, round or run) is refused in one line naming the file;
impossible values in a checkpoint are refused; untouched files still load; a key folder that cannot be used stops a
run before any training."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from client_app.state import KEY_FILE, ClientState, StateDir, Tree
from common.config import parse_run_config
from common.storage.persist import CHECKPOINT_FILE, SIGNATURE_HEX, StateFileError, load_tree, save_tree, signing_key
from server_app.checkpoint import KEY_DIR_ENV, Checkpoint, load_checkpoint, restore, save_checkpoint, server_key_file
from server_app.clients import RunAborted

from .inprocess import InProcessFederation

FEDAMP = {"algorithm": "fedamp", "dataset": "digits", "fraction-train": 1.0, "local-epochs": 1, "num-rounds": 3}


@pytest.fixture(autouse=True)
def _server_key_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's key in this test's own folder, not the user's."""
    monkeypatch.setenv(KEY_DIR_ENV, str(tmp_path / "server-keys"))


def _fedamp(rounds: int = 1) -> InProcessFederation:
    fed = InProcessFederation(FEDAMP, 3)
    for rnd in range(1, rounds + 1):
        fed.train_round(rnd)
    return fed


def _checkpointed_run(tmp_path: Path) -> tuple[Path, InProcessFederation]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    fed = _fedamp()
    save_checkpoint(run_dir, Checkpoint(1, fed.strategy.state_dict(), [{"round": 1}], 2.5, []))
    return run_dir, fed


def _rescaled(tree: dict[str, Any]) -> dict[str, Any]:
    """Every client model doubled and the Gram matrix quadrupled: a state that is consistent in itself."""
    matrix = tree["state"]["matrix"]
    matrix["W"], matrix["G"] = np.asarray(matrix["W"]) * 2, np.asarray(matrix["G"]) * 4
    return tree


def _tamper(path: Path, how: str) -> None:
    """Rewrite `path` with rescaled models as someone without the key could."""
    signature = path.read_bytes()[-SIGNATURE_HEX:]
    tree = _rescaled(load_tree(path))
    if how == "unsigned":
        save_tree(path, tree)
    elif how == "own-key":
        save_tree(path, tree, key=os.urandom(32))
    else:  # the old file's signature kept on the new content
        save_tree(path, tree, key=os.urandom(32))
        data = bytearray(path.read_bytes())
        data[-SIGNATURE_HEX:] = signature
        path.write_bytes(bytes(data))


def test_the_rescaled_state_is_consistent_so_only_the_signature_can_tell() -> None:
    fed = _fedamp()
    tree = _rescaled({"state": fed.strategy.state_dict()})
    restore(_fedamp(0).strategy, None, Checkpoint(1, tree["state"], [{"round": 1}]))  # accepted: no error


@pytest.mark.parametrize("how", ["unsigned", "own-key", "old-signature"])
def test_a_consistently_rescaled_checkpoint_is_refused_in_one_line(tmp_path: Path, how: str) -> None:
    run_dir, _ = _checkpointed_run(tmp_path)
    _tamper(run_dir / CHECKPOINT_FILE, how)
    with pytest.raises(StateFileError, match=f"{CHECKPOINT_FILE}: refused: ") as info:
        load_checkpoint(run_dir)
    assert "\n" not in str(info.value) and str(run_dir / CHECKPOINT_FILE) in str(info.value)


def test_one_changed_byte_is_refused_by_its_signature(tmp_path: Path) -> None:
    run_dir, _ = _checkpointed_run(tmp_path)
    path = run_dir / CHECKPOINT_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(StateFileError, match="refused: its signature does not match"):
        load_checkpoint(run_dir)


def test_a_resume_from_a_changed_checkpoint_stops_with_one_error_line(tmp_path: Path, caplog) -> None:
    from server_app.app import RunFailed, open_run_dir

    run_dir, _ = _checkpointed_run(tmp_path)
    raw = {**FEDAMP, "results-dir": str(tmp_path)}
    (run_dir / "config.json").write_text(json.dumps(parse_run_config(raw).to_dict()))
    cfg = parse_run_config({**raw, "resume": str(run_dir)})
    _, checkpoint, lock = open_run_dir(cfg)
    lock.release()
    assert checkpoint is not None  # untouched: resumes
    _tamper(run_dir / CHECKPOINT_FILE, "own-key")
    with caplog.at_level(logging.ERROR, logger="flwr"), pytest.raises(RunFailed):
        open_run_dir(cfg)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "checkpoint.npz: refused: its signature does not match" in errors[0]
    assert "\n" not in errors[0]


def test_an_untouched_checkpoint_loads_and_restores(tmp_path: Path) -> None:
    run_dir, fed = _checkpointed_run(tmp_path)
    checkpoint = load_checkpoint(run_dir)
    assert checkpoint.round == 1 and checkpoint.elapsed_s == 2.5 and checkpoint.records == [{"round": 1}]
    resumed = _fedamp(0)
    restore(resumed.strategy, None, checkpoint)
    assert np.array_equal(resumed.strategy.matrix.W, fed.strategy.matrix.W)
    key_file = server_key_file()
    assert key_file.parent == tmp_path / "server-keys" and not key_file.is_relative_to(run_dir)
    assert key_file.stat().st_mode & 0o777 == 0o600 and key_file.parent.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize(
    ("round_", "elapsed", "resumes", "why"),
    [
        (1, float("nan"), [], "elapsed time nan"),
        (1, float("inf"), [], "elapsed time inf"),
        (1, -3.0, [], "elapsed time -3.0"),
        (1.0, 1.0, [], "round 1.0 is not a whole number"),
        (1, 1.0, [5], r"resumed after rounds \[5\]"),
        (1, 1.0, [0], r"resumed after rounds \[0\]"),
    ],
)
def test_impossible_values_in_a_signed_checkpoint_are_refused(
    tmp_path: Path, round_: Any, elapsed: float, resumes: list[int], why: str
) -> None:
    save_checkpoint(tmp_path, Checkpoint(round_, {"global": []}, [{"round": 1}], elapsed, resumes))
    with pytest.raises(StateFileError, match=f"damaged checkpoint .*{why}"):
        load_checkpoint(tmp_path)


def test_a_key_others_could_read_is_refused(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, Checkpoint(1, {"global": []}, [{"round": 1}], 1.0, []))
    server_key_file().chmod(0o644)
    with pytest.raises(StateFileError, match="server.key: key file refused: .* mode 0600"):
        load_checkpoint(tmp_path)


def test_a_missing_server_key_is_named(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, Checkpoint(1, {"global": []}, [{"round": 1}], 1.0, []))
    server_key_file().unlink()
    with pytest.raises(StateFileError, match="checkpoint.npz: cannot be verified: .*server.key: .* missing"):
        load_checkpoint(tmp_path)


def test_a_checkpoint_without_a_usable_key_folder_aborts_the_run_in_one_line(tmp_path, monkeypatch) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(KEY_DIR_ENV, str(tmp_path / "a-file" / "keys"))
    with pytest.raises(RunAborted, match="cannot sign the checkpoint: .*cannot create the key file"):
        save_checkpoint(tmp_path, Checkpoint(1, {"global": []}, [{"round": 1}], 1.0, []))


def test_a_checkpoint_copied_from_another_runs_folder_is_refused(tmp_path: Path) -> None:
    fed = _fedamp()
    for name in ("run-a", "run-b"):
        (tmp_path / name).mkdir()
        save_checkpoint(tmp_path / name, Checkpoint(1, fed.strategy.state_dict(), [{"round": 1}], 1.0, []))
    shutil.copyfile(tmp_path / "run-a" / CHECKPOINT_FILE, tmp_path / "run-b" / CHECKPOINT_FILE)
    with pytest.raises(StateFileError, match="run-b/checkpoint.npz: refused: its signature does not match") as info:
        load_checkpoint(tmp_path / "run-b")
    assert "\n" not in str(info.value)
    assert load_checkpoint(tmp_path / "run-a").round == 1  # the original, in its own folder, still loads


@pytest.mark.parametrize("every", [1, 0])
def test_an_unusable_key_folder_stops_a_new_run_before_its_folder_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, every: int
) -> None:
    from server_app.app import RunFailed, open_run_dir

    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(KEY_DIR_ENV, str(tmp_path / "a-file" / "keys"))
    cfg = parse_run_config({**FEDAMP, "results-dir": str(tmp_path / "results"), "checkpoint-every": every})
    if not every:  # no checkpoints: no key needed
        run_dir, _, lock = open_run_dir(cfg)
        lock.release()
        assert run_dir.is_dir()
        return
    with caplog.at_level(logging.ERROR, logger="flwr"), pytest.raises(RunFailed):
        open_run_dir(cfg)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0]
    assert "cannot sign the checkpoint: " in errors[0] and "cannot create the key file" in errors[0]
    assert not (tmp_path / "results").exists()


def test_a_new_run_makes_the_server_key_when_its_folder_is_opened(tmp_path: Path) -> None:
    from server_app.app import open_run_dir

    cfg = parse_run_config({**FEDAMP, "results-dir": str(tmp_path / "results"), "checkpoint-every": 1})
    assert not server_key_file().exists()
    open_run_dir(cfg)[2].release()
    assert server_key_file().stat().st_mode & 0o777 == 0o600  # before any round, not at the first checkpoint


# ----- a client's stored state --------------------------------------------------------------------------------
def _record(value: float) -> Tree:
    state = ClientState()
    state.save_arrays("personal", [np.full(3, value, np.float32)])
    return state.tree


def _value(record: Tree) -> float:
    arrays = ClientState(record).load_arrays("personal")
    assert arrays is not None
    return float(arrays[0][0])


def test_an_untouched_client_state_loads_and_its_key_is_private(tmp_path: Path) -> None:
    store = StateDir(tmp_path / "run-a" / "partition-0", run="run-a", partition=0)
    store.save(1, _record(1.0), checkpoint_round=None)
    loaded = store.load(2, training=True)
    assert loaded is not None and loaded[0] == 1 and _value(loaded[1]) == 1.0
    key_file = tmp_path / "run-a" / KEY_FILE
    assert store.key_file == key_file and key_file.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("signed", [False, True])
def test_a_client_state_file_modified_on_disk_is_refused_not_replaced(tmp_path: Path, signed: bool) -> None:
    store = StateDir(tmp_path / "run-a" / "partition-0", run="run-a", partition=0)
    store.save(1, _record(1.0), checkpoint_round=None)
    path = store.path / "round-000001.npz"
    tree = load_tree(path)
    tree["personal"]["0"] = tree["personal"]["0"] * 100
    save_tree(path, tree, key=os.urandom(32) if signed else None)
    with pytest.raises(StateFileError, match="round-000001.npz: refused: ") as info:
        store.load(2, training=True)
    assert "\n" not in str(info.value) and store.versions() == [1]


def _store(tmp_path: Path, run: str, partition: int) -> StateDir:
    """A device's state dir: <state-dir>/<run>/partition-<id>, one key per state folder (shared here by both runs)."""
    path = tmp_path / "states" / run / f"partition-{partition}"
    return StateDir(path, run=run, partition=partition, key_file=tmp_path / "states" / KEY_FILE)


@pytest.mark.parametrize("moved_from", ["partition", "round", "run"])
def test_a_client_state_file_moved_from_elsewhere_is_refused(tmp_path: Path, moved_from: str) -> None:
    target = _store(tmp_path, "run-a", 0)
    target.save(3, _record(1.0), checkpoint_round=None)
    source = {"partition": _store(tmp_path, "run-a", 1), "round": target, "run": _store(tmp_path, "run-b", 0)}
    if moved_from != "round":  # partition 1's (or run-b's) round 5 copied into partition 0 of run-a
        source[moved_from].save(5, _record(7.0), checkpoint_round=None)
        shutil.copyfile(source[moved_from].path / "round-000005.npz", target.path / "round-000005.npz")
    else:  # an older round renamed to a newer one
        shutil.copyfile(target.path / "round-000003.npz", target.path / "round-000005.npz")
    with pytest.raises(StateFileError, match="partition-0/round-000005.npz: refused: its signature does not match"):
        target.load(6, training=True)
    (target.path / "round-000005.npz").unlink()
    untouched = target.load(6, training=True)
    assert untouched is not None and untouched[0] == 3 and _value(untouched[1]) == 1.0
    if moved_from != "round":
        original = source[moved_from].load(6, training=True)
        assert original is not None and original[0] == 5 and _value(original[1]) == 7.0


def test_a_client_state_whose_key_is_gone_is_refused(tmp_path: Path) -> None:
    store = StateDir(tmp_path / "run-a" / "partition-0", run="run-a", partition=0)
    store.save(1, _record(1.0), checkpoint_round=None)
    store.key_file.unlink()
    with pytest.raises(StateFileError, match="round-000001.npz: refused: cannot be verified: .*missing"):
        store.load(2, training=True)


def test_the_client_app_answers_a_refused_state_with_an_error_reply_and_one_line(tmp_path: Path, caplog) -> None:
    from client_app.app import train

    store = StateDir(tmp_path / "states" / "run-a" / "partition-0", run="run-a", partition=0)
    store.save(1, _record(1.0), checkpoint_round=None)
    save_tree(store.path / "round-000001.npz", load_tree(store.path / "round-000001.npz"))  # unsigned now

    class _Context:
        run_config = {"dataset": "digits", "client-state-dir": str(tmp_path / "states")}
        node_config = {"partition-id": 0, "num-partitions": 2}
        state = RecordDict()

    for name in ("run_id", "node_id", "task_id"):
        setattr(TaskIdentity, name, 1)
    config = ConfigRecord({"server-round": 2, "state-key": "run-a"})
    msg = Message(RecordDict({"config": config}), dst_node_id=1, message_type=MessageType.TRAIN)
    msg.metadata.__dict__["_message_id"] = "train-2"
    with caplog.at_level(logging.ERROR, logger="flwr"):
        reply = train(msg, _Context())  # type: ignore[arg-type]
    assert reply.has_error() and "round-000001.npz: refused: it has no signature" in reply.error.reason
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "client state refused: " in errors[0] and "round-000001.npz" in errors[0]
    assert store.versions() == [1], "the refused state is kept, not replaced by a fresh one"


def test_a_shared_key_file_is_made_once_whoever_comes_first(tmp_path: Path) -> None:
    key_file = tmp_path / "k" / "state.key"
    first = signing_key(key_file)
    assert signing_key(key_file) == first and len(first) == 32
    assert [p.name for p in key_file.parent.iterdir()] == ["state.key"]  # no temporary file left behind
