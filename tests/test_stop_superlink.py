"""`pflower stop-superlink` stops the SuperLink `flwr run` of this environment started for this FLWR_HOME and port,
and nothing else."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.run.superlink import descendants, flower_local_superlinks, stop_flower_local_superlink

PORT = "39191"
# Sleeps like a SuperLink; with --child it first starts a child process, as a SuperLink starts a simulation.
FAKE = """#!{python}
import subprocess, sys, time
if "--child" in sys.argv:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
time.sleep(120)
"""


def _fake_bin(folder: Path) -> Path:
    """A folder holding an executable named flower-superlink (and a same-acting one under another name)."""
    folder.mkdir(parents=True)
    for name in ("flower-superlink", "other-server"):
        script = folder / name
        script.write_text(FAKE.format(python=sys.executable))
        script.chmod(0o755)
    return folder


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """This environment's bin folder (as a venv's bin/ holds flower-superlink)."""
    return _fake_bin(tmp_path / "venv" / "bin")


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


def _listed(home: Path, bin_dir: Path) -> list[int]:
    """The matching SuperLinks, once the processes have started (their command lines are in /proc)."""
    deadline = time.monotonic() + 10
    while not (found := flower_local_superlinks(home, PORT, bin_dir)[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def test_stops_only_the_superlink_of_this_environment_home_and_port(tmp_path: Path, fake_bin: Path, started) -> None:
    home, other_home = tmp_path / "flwr-home", tmp_path / "another-home"
    other_bin = _fake_bin(tmp_path / "other-checkout" / ".venv" / "bin")
    target = _start(started, [str(fake_bin / "flower-superlink"), *_superlink_args(home)])
    another_environment = _start(started, [str(other_bin / "flower-superlink"), *_superlink_args(home)])
    decoys = [
        another_environment,  # the same FLWR_HOME and port (e.g. the default ones), another checkout's venv
        _start(started, [str(fake_bin / "flower-superlink"), *_superlink_args(other_home)]),  # another FLWR_HOME
        _start(started, [str(fake_bin / "flower-superlink"), *_superlink_args(home, "39192")]),  # another port
        _start(started, [str(fake_bin / "other-server"), *_superlink_args(home)]),  # another program, same arguments
    ]
    assert _listed(home, fake_bin) == [target.pid]
    assert flower_local_superlinks(home, PORT, fake_bin)[1] == [another_environment.pid]
    deadline = time.monotonic() + 30  # the target's child has started (a busy machine takes seconds to start it)
    while not descendants(target.pid) and time.monotonic() < deadline:
        time.sleep(0.05)

    text = stop_flower_local_superlink(home, PORT, wait=5.0, bin_dir=fake_bin)

    assert f"pid {target.pid}" in text and "1 process(es) it started" in text
    assert f"left running: the local SuperLink(s) of another environment (pid {another_environment.pid}" in text
    assert target.wait(timeout=10) is not None
    assert all(decoy.poll() is None for decoy in decoys), "only the matching SuperLink is stopped"
    assert flower_local_superlinks(home, PORT, fake_bin) == ([], [another_environment.pid])
    # From the other environment, that one is its own.
    assert f"pid {another_environment.pid}" in stop_flower_local_superlink(home, PORT, wait=5.0, bin_dir=other_bin)
    assert another_environment.wait(timeout=10) is not None


def test_says_when_none_is_running(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "empty-home"))
    assert main(["stop-superlink"]) == 0
    assert "nothing stopped" in capsys.readouterr().out
