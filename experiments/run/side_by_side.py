"""Shards of one sweep side by side on one machine under a deadline, and its finished runs packed for the way back."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from experiments.run.runs import run_state, set_aside
from experiments.run.superlink import stop_process_tree
from experiments.run.tether import tethered_popen

LOGS = "logs"  # the sweep's per-run logs, beside its run folders


@dataclass(frozen=True)
class ShardEnd:
    """How one shard ended: its exit code, or None when the deadline stopped it; and its seconds."""

    shard: int
    exit_code: int | None
    seconds: float


def shard_command(
    sweep_file: Path, shard: int, shards: int, workers: int, out: Path, extra: Sequence[str]
) -> list[str]:
    """The `pflower sweep` command line of shard `shard` (1-based) of `shards`."""
    return [
        sys.executable,
        "-m",
        "experiments.cli",
        "sweep",
        str(sweep_file),
        "--shard",
        f"{shard}/{shards}",
        "--workers",
        str(workers),
        "--out",
        str(out),
        *extra,
    ]


def run_side_by_side(
    commands: Sequence[Sequence[str]],
    logs: Sequence[Path],
    deadline_s: float,
    cwd: Path,
    poll_s: float = 5.0,
    on_poll: Callable[[float], None] | None = None,
) -> list[ShardEnd]:
    """Start every command at once, each in its own process group writing to its log; stop those still running at
    `deadline_s` (SIGTERM, then SIGKILL: a sweep resumes from each run's last checkpoint); how each ended."""
    started = time.monotonic()
    processes = []
    for command, log in zip(commands, logs, strict=True):
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as sink:
            processes.append(tethered_popen(list(command), cwd=cwd, stdout=sink, stderr=subprocess.STDOUT))
    ends: dict[int, ShardEnd] = {}
    while len(ends) < len(processes):
        elapsed = time.monotonic() - started
        for k, process in enumerate(processes, start=1):
            if k not in ends and process.poll() is not None:
                ends[k] = ShardEnd(k, process.returncode, elapsed)
        if len(ends) == len(processes):
            break
        if elapsed >= deadline_s:
            running = [(k, p) for k, p in enumerate(processes, start=1) if k not in ends]
            for _, process in running:  # all at once, so that their 15 s of grace overlap
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
            for k, process in running:
                stop_process_tree(process)
                ends[k] = ShardEnd(k, None, time.monotonic() - started)
            break
        if on_poll is not None:
            on_poll(elapsed)
        time.sleep(min(poll_s, max(0.05, deadline_s - elapsed)))
    return [ends[k] for k in sorted(ends)]


def finished_runs(out: Path) -> list[Path]:
    """The run folders under `out` whose run wrote its summary."""
    if not out.is_dir():
        return []
    return sorted(p for p in out.iterdir() if p.is_dir() and p.name != LOGS and run_state(p) == "finished")


def checksum_file(target: Path) -> Path:
    """Beside the archive `target` (runs.tgz): runs.sha256, the sha256 of the whole joined archive, checked before
    unpacking (not runs.tgz.sha256, which `cat runs.tgz*` would join in)."""
    return target.with_name(target.name.split(".")[0] + ".sha256")


def _parts_of(target: Path) -> list[Path]:
    """The parts of an archive `target` (target.0, target.00, target.000, ...), in their numeric order."""
    found = [p for p in target.parent.glob(f"{target.name}.*") if p.name[len(target.name) + 1 :].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(target.name) + 1 :]))


def pack(out: Path, target: Path, part_bytes: int = 15 * 2**20) -> list[Path]:
    """Write the finished runs' folders and the logs under `out` as one gzipped tar, `target` itself or, when larger
    than `part_bytes`, its parts `target.00`, `target.01`, ... (fixed width from their count, so they sort), and its
    sha256 beside it (checksum_file); the archive's files. Every file is 0600 in a folder made 0700, and the parts
    of an earlier archive of that name are removed first (never joined with these)."""
    from common.storage.persist import atomic_write_bytes, private_folder

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for run in finished_runs(out):
            archive.add(run, arcname=run.name)
        if (out / LOGS).is_dir():
            archive.add(out / LOGS, arcname=LOGS)
    data = buffer.getvalue()
    private_folder(target.parent)
    for stale in [target, *_parts_of(target), checksum_file(target)]:
        stale.unlink(missing_ok=True)
    count = max(1, -(-len(data) // part_bytes))
    width = max(2, len(str(count - 1)))
    parts = [target] if count == 1 else [target.with_name(f"{target.name}.{n:0{width}d}") for n in range(count)]
    for n, part in enumerate(parts):
        atomic_write_bytes(part, data[n * part_bytes : (n + 1) * part_bytes])  # 0600, never through a link
    digest = hashlib.sha256(data).hexdigest()
    atomic_write_bytes(checksum_file(target), f"{digest}  {target.name}\n".encode())
    return parts


def unpack(target: Path, into: Path) -> int:
    """Join `target` (or its parts), check the whole against checksum_file(target) before anything is extracted, and
    extract it into `into` (regular files and folders only, nothing outside `into`; a local folder of a run it holds
    is set aside under superseded/ first); the members extracted.
    ValueError, naming the file, when the checksum is missing or differs (an old or partial archive)."""
    parts = _parts_of(target) or [target]
    data = b"".join(p.read_bytes() for p in parts)
    checksum = checksum_file(target)
    if not checksum.is_file():
        raise ValueError(f"{checksum}: missing; without it an old or partial archive cannot be told apart")
    expected = checksum.read_text().split()[0] if checksum.read_text().split() else ""
    if hashlib.sha256(data).hexdigest() != expected:
        raise ValueError(
            f"{target}: its {len(parts)} part(s) do not match {checksum} (an old archive's parts, or one missing)"
        )
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        members = archive.getmembers()
        for name in sorted({m.name.split("/")[0] for m in members} - {LOGS}):
            if (into / name).exists():  # a local attempt of the same run: set aside, never mixed with this one
                set_aside(into / name)
        archive.extractall(into, filter="data")
    return len(members)
