"""`pflower stop-superlink` stops the SuperLink `flwr run` started for this FLWR_HOME and port, and nothing else."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.run.superlink import flower_local_superlinks, stop_flower_local_superlink

PORT = "39191"
# Sleeps like a SuperLink; with --child it first starts a child process, as a SuperLink starts a simulation.
FAKE = """#!{python}
import subprocess, sys, time
if "--child" in sys.argv:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
time.sleep(120)
"""


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """A folder holding an executable named flower-superlink (and a same-acting one under another name)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("flower-superlink", "other-server"):
        script = folder / name
        script.write_text(FAKE.format(python=sys.executable))
        script.chmod(0o755)
    return folder


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen]]:
    processes: list[subprocess.Popen] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def _superlink_args(home: Path, port: str = PORT) -> list[str]:
    """The arguments `flwr run` gives the local SuperLink it starts (flwr/cli/local_superlink.py)."""
    return [
        "--insecure",
        "--simulation",
        "--isolation",
        "subprocess",
        "--control-api-address",
        "127.0.0.1:39193",
        "--host",
        "127.0.0.1",
        "--port",
        port,
        "--log-file",
        str(home / "local-superlink" / "superlink.log"),
        "--child",
    ]


def _start(processes: list[subprocess.Popen], command: list[str]) -> subprocess.Popen:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    processes.append(process)
    return process


def _listed(home: Path) -> list[int]:
    """The matching SuperLinks, once the processes have started (their command lines are in /proc)."""
    deadline = time.monotonic() + 10
    while not (found := flower_local_superlinks(home, PORT)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def test_stops_only_the_superlink_of_this_home_and_port(tmp_path: Path, fake_bin: Path, started) -> None:
    home, other_home = tmp_path / "flwr-home", tmp_path / "another-home"
    target = _start(started, [str(fake_bin / "flower-superlink"), *_superlink_args(home)])
    decoys = [
        _start(started, [str(fake_bin / "flower-superlink"), *_superlink_args(other_home)]),  # another FLWR_HOME
        _start(started, [str(fake_bin / "flower-superlink"), *_superlink_args(home, "39192")]),  # another port
        _start(started, [str(fake_bin / "other-server"), *_superlink_args(home)]),  # another program, same arguments
    ]
    assert _listed(home) == [target.pid]
    time.sleep(0.5)  # the target's child has started

    line = stop_flower_local_superlink(home, PORT, wait=5.0)

    assert f"pid {target.pid}" in line and "1 process(es) it started" in line
    assert target.wait(timeout=10) is not None
    assert all(decoy.poll() is None for decoy in decoys), "only the matching SuperLink is stopped"
    assert flower_local_superlinks(home, PORT) == []


def test_says_when_none_is_running(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "empty-home"))
    assert main(["stop-superlink"]) == 0
    assert "nothing stopped" in capsys.readouterr().out
