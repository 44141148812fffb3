"""Shards side by side (bench/gpu_sweep.py's core): the deadline stops what still runs and only that, and the pack
holds the finished runs and the logs, in parts that join back to the same archive."""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import time
from pathlib import Path

from common.storage.run_folder import CHECKPOINT_FILE, CONFIG_FILE, SUMMARY_FILE
from experiments.run.side_by_side import finished_runs, pack, run_side_by_side, shard_command


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_deadline_stops_the_shard_still_running_and_its_children(tmp_path: Path) -> None:
    child_pid = tmp_path / "child.pid"
    quick = [sys.executable, "-c", "print('done')"]
    slow = [
        sys.executable,
        "-c",
        "import subprocess, sys, time; "
        f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        f"open({str(child_pid)!r}, 'w').write(str(c.pid)); time.sleep(120)",
    ]
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    logs = [tmp_path / "logs" / f"shard-{k}.log" for k in (1, 2, 3)]
    ends = run_side_by_side([quick, slow, failing], logs, deadline_s=3.0, cwd=tmp_path, poll_s=0.1)
    assert [(e.shard, e.exit_code) for e in ends] == [(1, 0), (2, None), (3, 3)]
    assert ends[1].seconds >= 3.0 and ends[0].seconds < 3.0
    assert logs[0].read_text().strip() == "done"
    child, waited = int(child_pid.read_text()), time.monotonic()
    while _alive(child) and time.monotonic() - waited < 10:  # a signalled process takes a moment to exit
        time.sleep(0.05)
    assert not _alive(child)


def _run(out: Path, name: str, finished: bool) -> None:
    run = out / name
    run.mkdir(parents=True)
    (run / CONFIG_FILE).write_text(json.dumps({"algorithm": "fedavg"}))
    (run / "metrics.jsonl").write_text('{"round": 1}\n')
    if finished:
        (run / SUMMARY_FILE).write_text("{}")
    else:
        (run / CHECKPOINT_FILE).write_bytes(os.urandom(4096))


def test_the_pack_holds_finished_runs_and_logs_and_its_parts_join_back(tmp_path: Path) -> None:
    out = tmp_path / "results"
    _run(out, "a-seed0", finished=True)
    _run(out, "b-seed0", finished=False)
    (out / "logs").mkdir()
    (out / "logs" / "a-seed0.log").write_text("round 1\n" * 200)
    (out / "logs" / "noise.bin").write_bytes(os.urandom(20_000))  # incompressible: the archive needs parts
    assert [p.name for p in finished_runs(out)] == ["a-seed0"]

    whole = pack(out, tmp_path / "back" / "runs.tgz")
    assert [p.name for p in whole] == ["runs.tgz"]
    with tarfile.open(whole[0]) as archive:
        names = set(archive.getnames())
    assert {"a-seed0/summary.json", "a-seed0/metrics.jsonl", "logs/a-seed0.log"} <= names
    assert not any(n.startswith("b-seed0") for n in names)

    parts = pack(out, tmp_path / "split" / "runs.tgz", part_bytes=8_000)
    assert [p.name for p in parts] == ["runs.tgz.00", "runs.tgz.01", "runs.tgz.02"]
    assert all(p.stat().st_size <= 8_000 for p in parts)
    joined = b"".join(p.read_bytes() for p in parts)
    with tarfile.open(fileobj=io.BytesIO(joined)) as archive:
        assert set(archive.getnames()) == names


def test_a_shard_command_names_its_shard_workers_folder_and_options(tmp_path: Path) -> None:
    command = shard_command(Path("s.toml"), 2, 5, 3, tmp_path, ["--only", "cifar-*"])
    assert command[1:] == [
        "-m", "experiments.cli", "sweep", "s.toml", "--shard", "2/5", "--workers", "3", "--out", str(tmp_path),
        "--only", "cifar-*",
    ]  # fmt: skip
