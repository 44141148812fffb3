"""`pflower sweep` stopped by a signal (SIGTERM from `kill` or `timeout`, SIGINT from Ctrl+C) stops the run it
started with everything below it: the run lives in its own session, so nothing else would reach it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from experiments.run.superlink import descendants, stop_process_tree
from tests.harness.processes import still_running
from tests.test_cli_e2e import _pflower

SWEEP = """name = "long"
preset = "smoke"
engine = "inprocess"
seeds = [0]

[defaults]
num-rounds = 500

[[experiment]]
name = "fedavg"
algorithm = "fedavg"
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signalled_sweep_stops_its_run(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    sweep = tmp_path / "long.toml"
    sweep.write_text(SWEEP)
    log = (tmp_path / "stdout").open("w")
    process = subprocess.Popen(
        [_pflower(), "sweep", str(sweep), "--out", str(tmp_path / "out"), "--workers", "1"],
        stdout=log,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # Ctrl+C's default: a shell's background job starts with SIGINT ignored, and Python keeps an inherited SIG_IGN
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        run_dir = tmp_path / "out" / "fedavg-seed0"
        while time.monotonic() < deadline and not (run_dir / "checkpoint.npz").exists():
            time.sleep(0.2)
        started = descendants(process.pid)
        assert len(started) >= 2, "the run (server and worker) did not start in 2 minutes"
        os.kill(process.pid, sig)  # the sweep only, as `timeout` or `kill` does
        assert process.wait(timeout=60) == code
        assert "finished runs are kept" in (process.stderr.read() if process.stderr else "")
        # the line before the exit says where the run stopped and that its checkpoint resumes it
        stopped = [line for line in (tmp_path / "stdout").read_text().splitlines() if "stopped after" in line]
        assert len(stopped) == 1 and "of 500 rounds; its checkpoint of round " in stopped[0], stopped
        assert "the same command resumes it" in stopped[0]
        assert not still_running(started), "processes of the run outlived the sweep"
    finally:
        stop_process_tree(process, graceful=False)
        log.close()
