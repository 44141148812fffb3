"""What the signatures bind (security third pass, item 5): a random run id made at the run's start, so a checkpoint
or a client's state from another run of the same name is refused; an older checkpoint put back is refused; a device
keeps each run's state in its own folder; a lost state key says what to do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from client_app.state import ClientState, StateDir, Tree
from common.config import parse_run_config
from common.storage.persist import CHECKPOINT_FILE, StateFileError
from common.wire.validation import PayloadError
from server_app.checkpoint import (
    KEY_DIR_ENV,
    RUN_ID_FILE,
    Checkpoint,
    load_checkpoint,
    new_run_id,
    read_run_id,
    save_checkpoint,
)

RAW = {"algorithm": "fedavg", "dataset": "digits", "num-rounds": 5}


@pytest.fixture(autouse=True)
def _server_key_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_DIR_ENV, str(tmp_path / "server-keys"))


def _run(results: Path, rounds: int = 1) -> Path:
    """A new run folder named 'run' under `results` (as the app makes it, with its id) and checkpoints."""
    from server_app.app import open_run_dir

    run_dir, _, lock = open_run_dir(parse_run_config({**RAW, "results-dir": str(results), "run-name": "run"}))
    lock.release()
    for rnd in range(1, rounds + 1):
        save_checkpoint(
            run_dir, Checkpoint(rnd, {"x": np.full(2, float(rnd))}, [{"round": r} for r in range(1, rnd + 1)])
        )
    return run_dir


def test_every_run_gets_its_own_id_kept_private(tmp_path: Path) -> None:
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    assert a.name == b.name == "run"
    assert len(read_run_id(a)) == 32 and read_run_id(a) != read_run_id(b)
    assert (a / RUN_ID_FILE).stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        new_run_id(a)  # never replaced
    (a / RUN_ID_FILE).write_text("not hex\n")
    with pytest.raises(StateFileError, match="damaged"):
        read_run_id(a)


def test_a_checkpoint_from_another_folder_of_the_same_run_name_is_refused(tmp_path: Path) -> None:
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    assert load_checkpoint(a).round == 1
    shutil.copyfile(b / CHECKPOINT_FILE, a / CHECKPOINT_FILE)  # signed by the same server key, same run name
    with pytest.raises(StateFileError, match="refused: its signature does not match"):
        load_checkpoint(a)


def test_an_older_checkpoint_put_back_is_refused(tmp_path: Path) -> None:
    run_dir = _run(tmp_path, rounds=1)
    older = tmp_path / "older.npz"
    shutil.copyfile(run_dir / CHECKPOINT_FILE, older)
    save_checkpoint(run_dir, Checkpoint(2, {"x": np.zeros(2)}, [{"round": 1}, {"round": 2}]))
    shutil.copyfile(older, run_dir / CHECKPOINT_FILE)
    with pytest.raises(StateFileError, match="holds round 1, but this run wrote a checkpoint of round 2"):
        load_checkpoint(run_dir)


def test_a_resumed_run_keeps_its_id_and_sends_it_with_the_state_key(tmp_path: Path) -> None:
    from server_app.app import open_run_dir

    run_dir = _run(tmp_path, rounds=1)
    (run_dir / "config.json").write_text(json.dumps(parse_run_config({**RAW, "results-dir": str(tmp_path)}).to_dict()))
    resumed, checkpoint, lock = open_run_dir(
        parse_run_config({**RAW, "results-dir": str(tmp_path), "resume": str(run_dir)})
    )
    lock.release()
    assert resumed == run_dir and checkpoint is not None and checkpoint.round == 1
    assert read_run_id(resumed) == read_run_id(run_dir)


def _record(value: float) -> Tree:
    state = ClientState()
    state.save_arrays("personal", [np.full(3, value, np.float32)])
    return state.tree


def test_a_client_state_of_another_run_of_the_same_name_is_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "states" / ".state.key"
    first = StateDir(tmp_path / "states" / "a", run="run", partition=0, key_file=key_file, run_id="1" * 32)
    first.save(3, _record(1.0), checkpoint_round=None)
    second = StateDir(tmp_path / "states" / "b", run="run", partition=0, key_file=key_file, run_id="2" * 32)
    second.path.mkdir(parents=True)
    shutil.copyfile(first.path / "round-000003.npz", second.path / "round-000003.npz")
    with pytest.raises(StateFileError, match="refused: its signature does not match"):
        second.load(4, training=True)


def _message(config: dict) -> Message:
    for name in ("run_id", "node_id", "task_id"):
        setattr(TaskIdentity, name, 1)
    return Message(RecordDict({"config": ConfigRecord(config)}), dst_node_id=1, message_type=MessageType.TRAIN)


def test_a_device_keeps_each_runs_state_in_its_own_folder(tmp_path: Path) -> None:
    from client_app.app import state_dir
    from common.sections import OutputSettings

    class Context:
        node_config = {"partition-id": 3, "num-partitions": 5, "state-dir": str(tmp_path)}

    output = parse_run_config({}).output
    assert isinstance(output, OutputSettings)
    one = state_dir(Context(), _message({"state-key": "run", "run-id": "a" * 32}), output)  # type: ignore[arg-type]
    two = state_dir(Context(), _message({"state-key": "run", "run-id": "b" * 32}), output)  # type: ignore[arg-type]
    assert one is not None and two is not None and one.path != two.path
    assert one.path == tmp_path / f"run.{'a' * 12}" / "partition-3" and one.run_id == "a" * 32
    legacy = state_dir(Context(), _message({"state-key": "run"}), output)  # type: ignore[arg-type]
    assert legacy is not None and legacy.path == tmp_path / "run" / "partition-3"
    for bad in ("../x", "A" * 32, "a" * 33):
        with pytest.raises(PayloadError, match="run-id is not a run id"):
            state_dir(Context(), _message({"state-key": "run", "run-id": bad}), output)  # type: ignore[arg-type]


def test_a_lost_state_key_says_what_to_do(tmp_path: Path) -> None:
    store = StateDir(tmp_path / "run" / "partition-0", run="run", partition=0, run_id="c" * 32)
    store.save(1, _record(1.0), checkpoint_round=None)
    store.key_file.unlink()
    with pytest.raises(StateFileError, match="Put the key back from a backup, or delete .*partition-0 to start") as e:
        store.load(2, training=True)
    assert "\n" not in str(e.value)
