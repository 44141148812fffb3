"""Shards side by side (bench/gpu_sweep.py's core): the deadline stops what still runs and only that, and the pack
holds the finished runs and the logs, in parts that join back to the same archive."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tarfile
import time
from pathlib import Path

import pytest

from common.storage.run_folder import CHECKPOINT_FILE, CONFIG_FILE, SUMMARY_FILE
from experiments.run.side_by_side import finished_runs, pack, run_side_by_side, shard_command

from .conftest import REPO
from .harness.processes import alive


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
    while alive(child) and time.monotonic() - waited < 10:  # a signalled process takes a moment to exit
        time.sleep(0.05)
    assert not alive(child)


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


def _packed(tmp_path: Path, noise: int = 20_000) -> Path:
    out = tmp_path / "results"
    if not out.exists():
        _run(out, "a-seed0", finished=True)
        (out / "logs").mkdir()
    (out / "logs" / "noise.bin").write_bytes(os.urandom(noise))  # incompressible: the archive needs parts
    return out


def test_the_pack_is_private_sorts_past_99_parts_and_leaves_no_stale_part(tmp_path: Path) -> None:
    """Found by an attack pass: runs.tgz was 0644 around 0600 personal models, part .100 sorted between .10 and
    .11, and a larger earlier archive's last parts stayed to be joined with a new one."""
    import stat

    from experiments.run.side_by_side import checksum_file

    out = _packed(tmp_path, noise=120_000)
    target = tmp_path / "back" / "runs.tgz"
    first = pack(out, target, part_bytes=1_000)
    assert len(first) > 100 and first[0].name == "runs.tgz.000" and first[100].name == "runs.tgz.100"
    assert sorted(p.name for p in first) == [p.name for p in first], "shell globs join them in order"
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in [*first, checksum_file(target)])
    assert stat.S_IMODE(target.parent.stat().st_mode) == 0o700
    (out / "logs" / "noise.bin").write_bytes(os.urandom(5_000))
    second = pack(out, target, part_bytes=1_000)
    assert sorted(target.parent.iterdir()) == sorted([*second, checksum_file(target)]), "no part of the old archive"


def test_an_archive_whose_parts_do_not_match_its_checksum_is_not_unpacked(tmp_path: Path) -> None:
    from experiments.run.side_by_side import checksum_file, unpack

    out = _packed(tmp_path)
    target = tmp_path / "back" / "runs.tgz"
    parts = pack(out, target, part_bytes=8_000)
    local = tmp_path / "here" / "a-seed0"
    local.mkdir(parents=True)
    (local / "checkpoint.npz").write_bytes(b"a local attempt's")  # a local attempt of the same run
    assert unpack(target, tmp_path / "here") > 0 and (local / "summary.json").is_file()
    assert not (local / "checkpoint.npz").exists(), "never mixed with the local attempt's files"
    assert [p.name for p in (tmp_path / "here" / "superseded").iterdir()][0].startswith("a-seed0-")
    parts[-1].unlink()  # a part lost on the way
    with pytest.raises(ValueError, match="do not match"):
        unpack(target, tmp_path / "there")
    assert not (tmp_path / "there").exists(), "nothing extracted"
    pack(out, target, part_bytes=8_000)
    checksum_file(target).unlink()
    with pytest.raises(ValueError, match="missing"):
        unpack(target, tmp_path / "there")


def test_the_gpu_recipe_uses_no_fixed_path_in_a_shared_temporary_folder() -> None:
    """bench/gpu_carry.sh printed `pip install --target /tmp/site` and PYTHONPATH=/tmp/site: another local user who
    made /tmp/site first ran code as the operator."""
    text = (REPO / "bench" / "gpu_carry.sh").read_text()
    assert "mktemp -d" in text
    assert not re.findall(r"/tmp/[\w.-]", text), re.findall(r"/tmp/[\w.-]+", text)


def test_a_shard_command_names_its_shard_workers_folder_and_options(tmp_path: Path) -> None:
    command = shard_command(Path("s.toml"), 2, 5, 3, tmp_path, ["--only", "cifar-*"])
    assert command[1:] == [
        "-m", "experiments.cli", "sweep", "s.toml", "--shard", "2/5", "--workers", "3", "--out", str(tmp_path),
        "--only", "cifar-*",
    ]  # fmt: skip
