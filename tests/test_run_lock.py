"""One run folder, one server: a second ServerApp on a live run's folder (a resume while the first still runs) is
refused in one line naming the holder; the folder is free again when the holder ends, even by kill -9; a sweep
neither resumes nor sets aside a folder a live server holds."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.config import parse_run_config
from common.storage.run_lock import LOCK_FILE, RunFolderBusy, RunLock, holder
from server_app.checkpoint import KEY_DIR_ENV, Checkpoint, load_checkpoint, save_checkpoint

from .conftest import REPO

RAW = {"algorithm": "fedavg", "dataset": "digits", "num-rounds": 5}
HOLD = (  # a second process holding the folder, as a live server does
    "import sys, time; from common.storage.run_lock import RunLock; RunLock(sys.argv[1]).acquire(); "
    "print('held', flush=True); time.sleep(600)"
)


@pytest.fixture(autouse=True)
def _server_key_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_DIR_ENV, str(tmp_path / "server-keys"))


def _held_by_another_process(run_dir: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def test_a_second_holder_is_refused_naming_the_first_until_it_ends_even_by_kill_9(tmp_path: Path) -> None:
    child = _held_by_another_process(tmp_path)
    try:
        named = f"pid {child.pid} on host {socket.gethostname()}"
        assert holder(tmp_path) is not None and named in holder(tmp_path)
        with pytest.raises(RunFolderBusy, match=f"{tmp_path} is in use by another server \\({named}, since "):
            RunLock(tmp_path).acquire()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert holder(tmp_path) is None  # the kernel dropped the dead holder's lock
    with RunLock(tmp_path):
        assert f"pid {os.getpid()} " in holder(tmp_path)
        with pytest.raises(RunFolderBusy):  # another descriptor of this very process is refused too
            RunLock(tmp_path).acquire()
    assert holder(tmp_path) is None and (tmp_path / LOCK_FILE).read_text() == "", "released: no stale name"
    assert holder(tmp_path / "no-such-run") is None


def _checkpointed_run(results: Path) -> Path:
    """A new run folder (as the app makes it) with its config and a checkpoint of round 1; released."""
    from server_app.app import open_run_dir

    run_dir, _, lock = open_run_dir(parse_run_config({**RAW, "results-dir": str(results), "run-name": "run"}))
    lock.release()
    (run_dir / "config.json").write_text(json.dumps(parse_run_config({**RAW, "results-dir": str(results)}).to_dict()))
    save_checkpoint(run_dir, Checkpoint(1, {"x": np.ones(2)}, [{"round": 1}]))
    return run_dir


def test_a_resume_of_a_folder_a_live_server_holds_is_refused_in_one_line(tmp_path: Path, caplog) -> None:
    from server_app.app import RunFailed, open_run_dir

    run_dir = _checkpointed_run(tmp_path)
    cfg = parse_run_config({**RAW, "results-dir": str(tmp_path), "resume": str(run_dir)})
    child = _held_by_another_process(run_dir)
    try:
        with caplog.at_level(logging.ERROR, logger="flwr"), pytest.raises(RunFailed):
            open_run_dir(cfg)
    finally:
        child.kill()
        child.wait()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "\n" not in errors[0]
    assert f"resume: {run_dir} is in use by another server (pid {child.pid} on host " in errors[0]
    resumed, checkpoint, lock = open_run_dir(cfg)  # the holder is gone: the resume goes on
    try:
        assert resumed == run_dir and checkpoint is not None and checkpoint.round == 1
        with pytest.raises(RunFailed):  # and it holds the folder in its turn
            open_run_dir(cfg)
    finally:
        lock.release()
    assert load_checkpoint(run_dir).round == 1


def test_new_runs_of_one_name_made_at_once_get_folders_of_their_own(tmp_path: Path) -> None:
    from server_app.results import make_run_dir

    folders = [make_run_dir(tmp_path, "fedavg", "digits", "same") for _ in range(3)]
    assert [f.name for f in folders] == ["same", "same-2", "same-3"]


def test_a_sweep_neither_resumes_nor_sets_aside_a_folder_a_live_server_holds(tmp_path: Path) -> None:
    from experiments.run.presets import preset
    from experiments.run.runs import execute, plan, run_state

    spec = plan("exp", preset("smoke"), {}, [0])[0]
    run_dir = tmp_path / spec.name
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}")  # before its first checkpoint: a sweep would set it aside

    class MustNotRun:
        name = "test"
        counts_its_cpu = False

        def run(self, *args: object) -> None:
            raise AssertionError("a held folder's run was started again")

    child = _held_by_another_process(run_dir)
    try:
        assert run_state(run_dir) == "running"
        result = execute(MustNotRun(), tmp_path, spec, tmp_path, False, lambda line: None)  # type: ignore[arg-type]
    finally:
        child.kill()
        child.wait()
    assert result.status == "failed" and f"its folder is in use by pid {child.pid} on host" in result.reason
    assert (run_dir / "config.json").is_file() and not (tmp_path / "incomplete").exists()
    assert run_state(run_dir) == "incomplete"


def test_a_run_stopped_before_its_checkpoints_round_was_noted_still_names_that_round(tmp_path: Path) -> None:
    from experiments.run.runs import stopped_line
    from server_app.checkpoint import _rounds_file, read_run_id

    run_dir = _checkpointed_run(tmp_path)
    save_checkpoint(run_dir, Checkpoint(2, {"x": np.ones(2)}, [{"round": 1}, {"round": 2}]))
    assert "; its checkpoint of round 2 is kept" in stopped_line(run_dir)
    # a signal between the checkpoint's rename and the note of its round (a sweep stopped under load)
    _rounds_file(read_run_id(run_dir)).unlink()
    assert "; its checkpoint of round 2 is kept and the same command resumes it" in stopped_line(run_dir)
    (run_dir / "checkpoint.npz").write_bytes(b"damaged")
    assert "; its checkpoint is kept" in stopped_line(run_dir)
