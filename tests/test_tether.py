"""A command started behind a tether (experiments/run/tether.py) stops with everything below it when the process
that started it dies, even by SIGKILL; otherwise the tether is transparent: the command's exit code or signal, and a
stop of the process group reaches the command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from experiments.run.tether import GRACE_S, POLL_S, descendants, kill_all, main, tethered_popen
from tests.harness.processes import still_running

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")

READY = "import signal, sys, time; {handler}print('ready', flush=True); time.sleep(120)"


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_the_commands_exit_code_and_signal_come_back_through_the_tether() -> None:
    assert tethered_popen(_python("raise SystemExit(3)")).wait(timeout=30) == 3
    assert tethered_popen(_python("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")).wait(timeout=30) == -15
    assert tethered_popen(_python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")).wait(timeout=30) == -9


def test_a_stop_of_the_group_reaches_the_command_and_the_tether_waits_for_it() -> None:
    code = READY.format(handler="signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); ")
    process = tethered_popen(_python(code), stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=30) == 7  # the command's own handler ran; the tether ended as it did


@pytest.mark.parametrize("command_ignores_sigterm", [False, True])
def test_a_killed_parent_takes_the_command_and_its_children_with_it(command_ignores_sigterm: bool) -> None:
    # the parent starts the tethered command, which starts a grandchild; each prints its pid; then the parent is killed
    handler = "signal.signal(signal.SIGTERM, signal.SIG_IGN); " if command_ignores_sigterm else ""
    command = (
        "import subprocess, sys, time, os, signal; " + handler + "child = subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(120)']); print(os.getpid(), child.pid, flush=True); time.sleep(120)"
    )
    parent = textwrap.dedent(
        f"""
        import sys, time
        from experiments.run.tether import tethered_popen
        tether = tethered_popen({_python(command)!r})
        print(tether.pid, flush=True)
        time.sleep(120)
        """
    )
    started = subprocess.Popen(_python(parent), stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1])
    try:
        assert started.stdout is not None
        tether = int(started.stdout.readline())
        command_pid, grandchild = (int(pid) for pid in started.stdout.readline().split())
        started.kill()  # SIGKILL: the parent runs no cleanup at all
        started.wait(timeout=10)
        patience = POLL_S + GRACE_S + 10 if command_ignores_sigterm else POLL_S + 10
        assert not still_running([tether, command_pid, grandchild], patience), "the command outlived its parent"
    finally:
        started.kill()


def test_a_tether_outside_its_own_group_stops_only_its_command() -> None:
    # started by hand in its owner's process group: when the owner dies, the group's other processes are not its own
    sleeper = "import time; time.sleep(120)"
    owner = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        from experiments.run import tether
        bystander = subprocess.Popen([sys.executable, "-c", {sleeper!r}])
        held = subprocess.Popen([sys.executable, "-P", tether.__file__, "--parent", str(os.getpid()), "--",
                                 sys.executable, "-c", {sleeper!r}])
        time.sleep(2)
        print(bystander.pid, held.pid, *tether.descendants(held.pid), flush=True)
        time.sleep(120)
        """
    )
    started = subprocess.Popen(
        _python(owner), stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1], start_new_session=True
    )
    bystander, held = 0, []
    try:
        assert started.stdout is not None
        bystander, *held = (int(pid) for pid in started.stdout.readline().split())
        assert len(held) == 2, "the tether and its command"
        started.kill()
        started.wait(timeout=10)
        assert not still_running(held, POLL_S + GRACE_S + 10), "the command outlived its owner"
        assert still_running([bystander], 0.0) == [bystander], "the tether stopped a process that was not its own"
    finally:
        kill_all([bystander, *held])


def test_a_killed_owner_leaves_no_private_superlink_running(tmp_path: Path) -> None:
    # `pflower run --engine simulation` killed by SIGKILL or the out-of-memory killer: its SuperLink writes to no pipe
    # of the owner's, so nothing but the tether would ever stop it
    owner = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from experiments.run.superlink import LocalSuperLink
        link = LocalSuperLink(Path(sys.argv[1])).start()
        print(link.process.pid, flush=True)
        time.sleep(300)
        """
    )
    running: list[int] = []
    started = subprocess.Popen(
        [*_python(owner), str(tmp_path / "home")], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[1]
    )
    try:
        assert started.stdout is not None
        tether = int(started.stdout.readline())
        running = [tether, *descendants(tether)]
        assert any(b"flower-superlink" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in running)
        started.kill()
        started.wait(timeout=10)
        assert not still_running(running, POLL_S + GRACE_S + 10), "the SuperLink outlived its owner"
    finally:
        started.kill()
        kill_all(running)  # what a failure left running


def test_a_malformed_call_says_how_to_call_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sleep", "1"]) == 2
    assert main(["--parent", "x", "--", "sleep", "1"]) == 2
    assert "usage: tether.py --parent PID -- COMMAND" in capsys.readouterr().err
