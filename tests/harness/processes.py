"""Whether processes are gone, read from /proc (a zombie counts as gone: it exited, its parent has not reaped it)."""

from __future__ import annotations

import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether the process runs (exists and is not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def still_running(pids: list[int], patience: float = 30.0) -> list[int]:
    """The processes of `pids` still running after waiting up to `patience` seconds for them all to exit."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.2)
    return [pid for pid in pids if alive(pid)]
