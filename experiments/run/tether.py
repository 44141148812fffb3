"""Run a command tied to the process that started it: when that process dies, even by SIGKILL or the kernel's
out-of-memory killer (which leave it no chance to clean up), the command and every process below it are stopped, so
no SuperLink, SuperNode, run or Ray worker keeps running, holding ports, memory and run folders, without its owner.

Run as a file (`python -P tether.py --parent PID -- COMMAND...`), so it imports only the standard library. The tether
and the command share one process group: a stop of that group (SIGTERM, Ctrl+C) reaches the command, which the
tether waits for, then ends the way the command ended (its exit code, or the same signal)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

POLL_S = 0.5  # how often the tether looks for its parent
GRACE_S = 15.0  # how long the command has to stop after SIGTERM before SIGKILL


def tethered_popen(command: Sequence[str], **popen: Any) -> subprocess.Popen:
    """`subprocess.Popen(command, **popen)` in a new session, behind a tether to this process (the Popen is the
    tether's; the command is its child, in the same process group)."""
    tether = [sys.executable, "-P", str(Path(__file__).resolve()), "--parent", str(os.getpid()), "--", *command]
    return subprocess.Popen(tether, **{**popen, "start_new_session": True})


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, grandchildren, ...), read from /proc; [] where there is no /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_all(pids: Sequence[int]) -> None:
    """SIGKILL each process that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _orphaned(child: subprocess.Popen) -> NoReturn:
    """The parent is gone: stop the command's tree (SIGTERM, SIGKILL after GRACE_S), then this tether. The whole
    process group only when the tether leads its own (as `tethered_popen` starts it), never a shell's job."""
    leads_group = os.getpgid(0) == os.getpid()
    below = descendants(os.getpid())
    if leads_group:
        os.killpg(0, signal.SIGTERM)  # this process only notes it (see main)
    else:
        child.terminate()
    try:
        child.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    kill_all(below)
    if leads_group:
        os.killpg(0, signal.SIGKILL)
    sys.exit(1)


def _end_like(returncode: int) -> int:
    """Exit the way the command ended: by the same signal (handlers back to the default), or with its code."""
    if returncode < 0:
        try:
            signal.signal(-returncode, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL and SIGSTOP keep theirs
            pass
        os.kill(os.getpid(), -returncode)
        time.sleep(1.0)  # the signal arrives meanwhile; a signal that does not end a process ends here
        return 128 - returncode
    return returncode


def main(argv: Sequence[str]) -> int:
    """`--parent PID -- COMMAND...`: run COMMAND until it ends, or stop it when process PID is no longer the parent."""
    if len(argv) < 4 or argv[0] != "--parent" or argv[2] != "--" or not argv[1].isdigit():
        print("usage: tether.py --parent PID -- COMMAND...", file=sys.stderr)
        return 2
    parent = int(argv[1])
    for stop in (signal.SIGTERM, signal.SIGINT):  # noted, not ignored: an ignored signal stays ignored across exec
        signal.signal(stop, lambda *_: None)
    child = subprocess.Popen(argv[3:])
    while os.getppid() == parent:  # re-parented once the parent is gone (also before the command started)
        try:
            return _end_like(child.wait(timeout=POLL_S))
        except subprocess.TimeoutExpired:
            pass
    _orphaned(child)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
