"""What another local user of the server or device can do to a run's files: run folders and client-state folders are
0700 and the files the project writes 0600, a symbolic link planted where a file will be written is never followed
(appends refuse it, atomic writes replace it), temporary files have unpredictable names, and a consent lock file
that is not the server's own is refused instead of blocking."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from common.storage.persist import append_text, atomic_write_text, private_folder
from common.storage.run_folder import RunFolder
from server_app.results.folder import make_run_dir


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_run_folder_and_what_the_project_writes_in_it_are_its_users_alone(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        run = make_run_dir(tmp_path / "results", "fedavg", "digits", "run")
        folder = RunFolder(run)
        folder.write_config({"algorithm": "fedavg"})
        folder.write_commits(["abc"])
        folder.append_round({"round": 1})
        folder.append_digests([{"round": 1}])
        folder.write_summary({"algorithm": "fedavg"}, "# run")
    finally:
        os.umask(old)
    assert _mode(run) == 0o700
    assert {p.name: _mode(p) for p in run.iterdir()} == dict.fromkeys((p.name for p in run.iterdir()), 0o600)
    assert len(list(run.iterdir())) == 6


def test_client_state_folders_are_made_0700_down_from_the_first_missing_one(tmp_path: Path) -> None:
    from client_app.state import StateDir

    old = os.umask(0o022)
    try:
        state = StateDir(tmp_path / "run" / "client-state" / "partition-3", run="run", partition=3)
        state.save(1, {"w": {"a": np.zeros(2, np.float32)}}, None)
    finally:
        os.umask(old)
    run = tmp_path / "run"
    for folder in (run, run / "client-state", run / "client-state" / "partition-3"):
        assert _mode(folder) == 0o700, folder
    before = _mode(tmp_path)
    private_folder(tmp_path)  # an existing folder is left as it is
    assert _mode(tmp_path) == before


def test_an_append_refuses_a_planted_link_and_leaves_its_target_alone(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("precious\n")
    run = make_run_dir(tmp_path / "results", "fedavg", "digits", "run")
    (run / "metrics.jsonl").symlink_to(target)
    with pytest.raises(OSError):
        RunFolder(run).append_round({"round": 1})
    with pytest.raises(OSError):
        append_text(run / "metrics.jsonl", "x")
    assert target.read_text() == "precious\n"


def test_an_atomic_write_replaces_a_planted_link_and_uses_an_unpredictable_temporary_name(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_text("precious\n")
    run = make_run_dir(tmp_path / "results", "fedavg", "digits", "run")
    (run / "code.json").symlink_to(target)
    for pid in (os.getpid(), os.getpid() + 1):  # the old predictable names: links there must not be written through
        (run / f".config.json.tmp-{pid}").symlink_to(target)
    RunFolder(run).write_commits(["abc"])
    atomic_write_text(run / "config.json", "{}")
    assert target.read_text() == "precious\n"
    assert not (run / "code.json").is_symlink() and _mode(run / "code.json") == 0o600
    assert (run / "config.json").read_text() == "{}"


def test_a_consent_lock_file_that_is_not_the_servers_own_is_refused_not_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    from server_app import takeover

    run = make_run_dir(tmp_path / "results", "fedavg", "digits", "run")
    lock = run / f".{takeover.CONSENT_FILE}.lock"
    lock.write_text("")
    me = os.geteuid()
    monkeypatch.setattr(takeover.os, "geteuid", lambda: me + 1)  # as if another user owned the file
    with pytest.raises(takeover.ConsentError, match="not a regular file of this user's"):
        takeover.allow(run, [3], 7)
    assert takeover.OperatorConsent(run).allows(3, 7) is False  # the server: a warning, no consent, no hang
    monkeypatch.undo()
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process holds it
    try:
        with pytest.raises(takeover.ConsentError, match="stayed locked"), takeover._locked(run, timeout=0.2):
            pass
    finally:
        os.close(fd)
    takeover.allow(run, [3], 7)
    assert takeover.OperatorConsent(run).allows(3, 7) is True
