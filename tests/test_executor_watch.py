"""`pflower-superlink` starts its ServerApp executor again when it dies (server_app/executor_watch.py), and exits for
its supervisor when the executor keeps dying; Flower's own SuperLink never looks at it again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from server_app import executor_watch
from server_app.executor_watch import EXIT_EXECUTOR_FAILED, MAX_DEATHS, ExecutorWatch, restart_delay


class FakeProcess:
    """A process that exits with `code` on its `lives`-th poll."""

    def __init__(self, pid: int, lives: int, code: int = 1) -> None:
        self.pid, self.lives, self.code, self.polls, self.terminated = pid, lives, code, 0, False

    def poll(self) -> int | None:
        self.polls += 1
        return self.code if self.polls >= self.lives else None

    def terminate(self) -> None:
        self.terminated = True


class Clock:
    """Time that moves `step` seconds at each read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def no_backoff(monkeypatch) -> None:
    monkeypatch.setattr(executor_watch, "BACKOFF_S", (0.0,))


def test_the_backoff_grows_and_the_fifth_death_in_the_window_gives_up() -> None:
    assert [restart_delay(n) for n in range(1, MAX_DEATHS + 1)] == [1.0, 2.0, 5.0, 10.0, None]


def test_a_dead_executor_is_started_again_and_the_superlink_goes_on(monkeypatch, caplog) -> None:
    no_backoff(monkeypatch)
    started: list[FakeProcess] = []
    given_up: list[int] = []

    def start() -> FakeProcess:
        started.append(FakeProcess(pid=100 + len(started), lives=3))
        if len(started) == 3:
            watch.stop()  # the SuperLink shuts down while its third executor runs
        return started[-1]

    # every executor lives 100 s of this clock: each death is a first one, never a reason to give up
    watch = ExecutorWatch(start=start, give_up=given_up.append, poll_s=0.0, grace_s=0.0, clock=Clock(100.0))
    with caplog.at_level("INFO", logger="flwr"):
        watch.watch(FakeProcess(pid=99, lives=3))
    assert [p.pid for p in started] == [100, 101, 102] and watch.restarts == 2
    assert started[-1].terminated, "an executor started while the SuperLink shuts down is stopped again"
    assert given_up == []
    assert "exited with code 1 after" in caplog.text and "runs again (pid 100)" in caplog.text


def test_an_executor_that_keeps_dying_ends_the_superlink_with_its_code(monkeypatch, caplog) -> None:
    no_backoff(monkeypatch)
    given_up: list[int] = []
    count = 0

    def start() -> FakeProcess:
        nonlocal count
        count += 1
        return FakeProcess(pid=count, lives=1, code=2)

    watch = ExecutorWatch(start=start, give_up=given_up.append, poll_s=0.0, grace_s=0.0, clock=Clock(1.0))
    watch.watch(FakeProcess(pid=0, lives=1, code=2))
    assert given_up == [EXIT_EXECUTOR_FAILED] and watch.restarts == MAX_DEATHS - 1
    assert f"exited {MAX_DEATHS} times within 600 s" in caplog.text


def test_an_executor_that_dies_every_61_s_is_not_restarted_forever(monkeypatch, caplog) -> None:
    """Found by an attack pass: deaths more than 60 s apart reset the count, so an executor that died every 61 s
    was restarted forever with an ERROR line each time; over a sliding 10-minute window the fifth death ends it."""
    no_backoff(monkeypatch)
    given_up: list[int] = []
    count = 0

    def start() -> FakeProcess | None:
        nonlocal count
        count += 1
        return FakeProcess(pid=count, lives=1) if count < 50 else None

    # every executor lives 61 s of this clock (one read at its start, one at its death: deaths 122 s apart)
    watch = ExecutorWatch(start=start, give_up=given_up.append, poll_s=0.0, grace_s=0.0, clock=Clock(61.0))
    watch.watch(FakeProcess(pid=0, lives=1))
    assert given_up == [EXIT_EXECUTOR_FAILED] and watch.restarts == MAX_DEATHS - 1


def test_a_shutdown_stops_the_executor_without_a_restart(monkeypatch) -> None:
    starts: list[int] = []

    def start() -> None:
        starts.append(1)

    watch = ExecutorWatch(start=start, give_up=lambda code: None, poll_s=0.0)
    watch.stop()  # e.g. systemd's stop: SIGTERM to the SuperLink and its executor at once
    watch.watch(FakeProcess(pid=1, lives=1))
    assert starts == []


def test_an_executor_stopped_with_the_superlink_is_neither_restarted_nor_reported(caplog) -> None:
    """systemd's stop signals the SuperLink and its executor at once: the executor may die before the SuperLink's
    shutdown begins; a death followed by the stop within the grace is that stop."""
    import threading

    def start() -> FakeProcess:
        raise AssertionError("started again during a stop")

    watch = ExecutorWatch(start=start, give_up=lambda code: None, poll_s=0.0, grace_s=30.0)
    threading.Timer(0.2, watch.stop).start()
    began = time.monotonic()
    watch.watch(FakeProcess(pid=1, lives=1, code=-15))
    assert time.monotonic() - began < 10 and "exited" not in caplog.text


def _children(pid: int) -> dict[int, str]:
    """The live child processes of `pid` and their command lines (Linux /proc)."""
    children = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                children[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
    return children


def _executor(link_pid: int, other_than: int | None, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [pid for pid, cmd in _children(link_pid).items() if "flower-superexec" in cmd and pid != other_than]
        if found:
            return found[0]
        time.sleep(0.2)
    raise AssertionError(f"no flower-superexec under the SuperLink within {timeout:.0f} s")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads child processes from /proc")
def test_pflower_superlink_starts_a_killed_executor_again(tmp_path: Path) -> None:
    from experiments.run.superlink import free_port

    bin_dir = Path(sys.executable).parent
    log_file = tmp_path / "superlink.log"
    command = [
        str(bin_dir / "pflower-superlink"),
        "--insecure",
        "--isolation",
        "subprocess",
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "--database",
        str(tmp_path / "state.db"),
        "--disable-runtime-dependency-installation",
    ]
    env: dict[str, Any] = {**os.environ, "FLWR_HOME": str(tmp_path), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    with open(log_file, "wb") as log:
        link = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        first = _executor(link.pid, None, timeout=60)
        os.kill(first, signal.SIGKILL)
        second = _executor(link.pid, first, timeout=30)
        assert link.poll() is None, "the SuperLink serves on"
        text = log_file.read_text()
        assert f"flower-superexec, pid {first}) exited with code -9" in text
        assert f"runs again (pid {second})" in text
    finally:
        os.killpg(link.pid, signal.SIGTERM)
        try:
            link.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(link.pid, signal.SIGKILL)
            link.wait()
