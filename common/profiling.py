"""Opt-in wall-time profile of named phases (bench/round_profile.py): off, and free, unless the environment
variable PFLOWER_PROFILE names a folder; then each process appends one JSON line per message or round there."""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from common.storage.persist import open_for_append

PROFILE_DIR = os.environ.get("PFLOWER_PROFILE", "")
ENABLED = bool(PROFILE_DIR)
IMPORTED_AT = time.time()  # when this process had imported the project


def _process_started() -> float | None:
    """When this process started (Linux: /proc), to tell its start-up and imports apart from its work."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


STARTED_AT = _process_started() if ENABLED else None

F = TypeVar("F", bound=Callable[..., Any])
_local = threading.local()
_first_message = True
_process_peak_mb = 0.0  # the process's peak before the latest reset of its high-water mark


def timed(name: str) -> Callable[[F], F]:
    """Decorator: add the call's wall time to phase `name` of the record being collected (no-op when disabled)."""

    def wrap(func: F) -> F:
        if not ENABLED:
            return func

        @functools.wraps(func)
        def timed_call(*args: Any, **kwargs: Any) -> Any:
            started, cpu = time.perf_counter(), time.process_time()
            try:
                return func(*args, **kwargs)
            finally:
                add(name, time.perf_counter() - started, time.process_time() - cpu)

        return timed_call  # type: ignore[return-value]

    return wrap


@contextmanager
def timer(name: str) -> Iterator[None]:
    """Add the block's wall time to phase `name` of the record being collected (nothing is kept when disabled)."""
    started, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        add(name, time.perf_counter() - started, time.process_time() - cpu)


def add(name: str, seconds: float, cpu_seconds: float = 0.0) -> None:
    """Add `seconds` (and the process's CPU-seconds) to phase `name` of the record being collected on this
    thread, if any."""
    phases = getattr(_local, "phases", None)
    if phases is not None:
        phases[name] = phases.get(name, 0.0) + seconds
        _local.cpu_phases[name] = _local.cpu_phases.get(name, 0.0) + cpu_seconds


def peak_rss_mb(pid: int | str = "self") -> float | None:
    """A process's (default: this one's) peak resident memory so far (Linux: VmHWM), in MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset this process's resident high-water mark (Linux >= 4.0: `5` to /proc/self/clear_refs), so that VmHWM
    counts from now; False where that is not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@contextmanager
def record(side: str, **fields: Any) -> Iterator[dict[str, Any]]:
    """Collect the phases timed inside the block into one line of this process's profile file (when enabled).
    The yielded dict takes more fields (e.g. the round, once known). Memory: `peak_rss_mb` is the process's peak so
    far, `message_peak_rss_mb` the peak since the block began (one block at a time: the mark is the process's)."""
    global _first_message, _process_peak_mb
    if not ENABLED:
        yield {}
        return
    line: dict[str, Any] = {
        "side": side,
        "os_pid": os.getpid(),
        "first": _first_message,
        "imported_at": IMPORTED_AT,
        "started_at": STARTED_AT,
        **fields,
    }
    _first_message = False
    _local.phases, _local.cpu_phases = {}, {}
    # each message's own peak: a long-lived process's high-water mark would otherwise hold its largest message's
    _process_peak_mb = max(_process_peak_mb, peak_rss_mb() or 0.0)
    own_peak = reset_peak_rss()
    line["start"], line["cpu_start"] = time.time(), time.process_time()
    try:
        yield line
    finally:
        line["end"], line["cpu_end"] = time.time(), time.process_time()
        message_peak = peak_rss_mb()
        _process_peak_mb = max(_process_peak_mb, message_peak or 0.0)
        line["peak_rss_mb"] = _process_peak_mb if message_peak is not None else None
        # None where the mark could not be reset: the peak since the process started, not this message's
        line["message_peak_rss_mb"] = message_peak if own_peak else None
        line["phases"], _local.phases = _local.phases, None
        line["cpu_phases"], _local.cpu_phases = _local.cpu_phases, None
        path = Path(PROFILE_DIR) / f"{side}-{os.getpid()}.jsonl"
        with open_for_append(path) as out:
            out.write(json.dumps(line) + "\n")


def time_method(obj: Any, method: str, name: str) -> None:
    """Time every call of `obj.method` as phase `name` (e.g. the Grid's send_and_receive); no-op when disabled."""
    if ENABLED:
        setattr(obj, method, timed(name)(getattr(obj, method)))
