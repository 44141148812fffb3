"""The `pflower` console script end to end: the CI smoke sweep runs, survives a kill without rerunning finished
runs, and `pflower report` renders it (real `flwr run` simulations on a private SuperLink)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.run.superlink import stop_process_tree

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "bench" / "sweeps" / "smoke.toml"
RUNS = ["fedavg-seed0", "fedavg-seed1", "dmpfl-seed0", "dmpfl-seed1"]


def _pflower() -> str:
    found = shutil.which("pflower") or str(Path(sys.executable).parent / "pflower")
    if not Path(found).exists():
        pytest.skip("the pflower console script is not installed (pip install -e .)")
    return found


def _sweep(out: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_pflower(), "sweep", str(SMOKE), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.e2e
def test_the_smoke_sweep_resumes_after_a_kill_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "smoke"
    first = out / RUNS[0] / "summary.json"
    killed = subprocess.Popen(
        [_pflower(), "sweep", str(SMOKE), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not first.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert first.exists(), "the first run of the sweep did not finish in 5 minutes"
    second = out / RUNS[1]
    while not second.exists() and killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)  # the second run is under way
    stop_process_tree(killed, graceful=False)  # as a crash or a closed laptop lid would
    # The in-process engine is fast enough that a run may finish within that second: count what finished.
    finished = {
        name: (out / name / "summary.json").stat().st_mtime_ns
        for name in RUNS
        if (out / name / "summary.json").exists()
    }
    assert RUNS[0] in finished and len(finished) < len(RUNS), sorted(finished)

    resumed = _sweep(out, 900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    done = len(finished)
    assert f"sweep: 4 runs, {done} finished earlier (kept), {4 - done} to run" in resumed.stdout
    assert "sweep: all 4 runs finished" in resumed.stdout
    for name, mtime in finished.items():  # the finished runs were not run again
        assert (out / name / "summary.json").stat().st_mtime_ns == mtime, name
    assert all((out / name / "summary.json").is_file() for name in RUNS)

    again = _sweep(out, 120)
    assert again.returncode == 0 and "4 finished earlier (kept), 0 to run" in again.stdout

    report = subprocess.run([_pflower(), "report", str(out)], capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    text = (out / "report" / "report.md").read_text()
    assert "4 runs in 2 experiments" in text
    assert "| fedavg | fedavg | 2 |" in text and "| dmpfl | dmpfl | 2 |" in text and "| dmpfl+ | dmpfl | 2 |" in text
    assert "Paired difference to `fedavg`" in text and "Held-out clients" in text
    for figure in ("accuracy_vs_shift.png", "costs.png", "frontier.png", "mask_overlap.png"):
        assert (out / "report" / figure).stat().st_size > 5_000, figure
