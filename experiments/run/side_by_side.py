"""Shards of one sweep side by side on one machine under a deadline, and its finished runs packed for the way back."""

from __future__ import annotations

import contextlib
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

from experiments.run.runs import run_state
from experiments.run.superlink import stop_process_tree

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
            processes.append(
                subprocess.Popen(list(command), cwd=cwd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
            )
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


def pack(out: Path, target: Path, part_bytes: int = 15 * 2**20) -> list[Path]:
    """Write the finished runs' folders and the logs under `out` as one gzipped tar, `target` itself or, when larger
    than `part_bytes`, its parts `target.00`, `target.01`, ... (`cat target.* | tar xz` joins them); the files."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for run in finished_runs(out):
            archive.add(run, arcname=run.name)
        if (out / LOGS).is_dir():
            archive.add(out / LOGS, arcname=LOGS)
    data = buffer.getvalue()
    target.parent.mkdir(parents=True, exist_ok=True)
    if len(data) <= part_bytes:
        target.write_bytes(data)
        return [target]
    parts = []
    for n, start in enumerate(range(0, len(data), part_bytes)):
        part = target.with_name(f"{target.name}.{n:02d}")
        part.write_bytes(data[start : start + part_bytes])
        parts.append(part)
    return parts
