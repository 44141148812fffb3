"""One run folder, one server: an exclusive lock on the folder's `run.lock`, held by the ServerApp for the run's
life and naming its holder, so a second ServerApp (a resume while the first still runs) is refused instead of
writing the same rounds twice."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from pathlib import Path
from types import TracebackType

from common.storage.persist import PRIVATE_FILE

try:
    import fcntl
except ImportError:  # not a POSIX system: no lock (the project runs on Linux and macOS)
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = "run.lock"
RETRY_S = 2.0  # a probe (`holder`) holds the lock for an instant: an acquire tries again this long before refusing


class RunFolderBusy(RuntimeError):
    """The run folder is held by another live server; the message names it."""


class ForeignLockFile(ValueError):
    """A lock path that is not a regular file of this user's (another user's file could be held forever)."""


def open_locked(path: Path, timeout: float) -> tuple[int, bool]:
    """A descriptor of the lock file `path` (made 0600 if missing, never through a link: OSError) and whether this
    process now holds its exclusive flock, tried without blocking for `timeout` s; the caller closes it (which lets
    the lock go). ForeignLockFile when the path is not a regular file of this user's."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, PRIVATE_FILE)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise ForeignLockFile(f"{path} is not a regular file of this user's: remove it")
    deadline = time.monotonic() + timeout
    while not _try_lock(fd):
        if time.monotonic() >= deadline:
            return fd, False
        time.sleep(0.05)
    return fd, True


def _try_lock(fd: int) -> bool:
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _describe(fd: int) -> str:
    """The holder as its lock file names it: 'pid P on host H since T' (or a plain 'another process')."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        who = json.loads(os.read(fd, 4096).decode())
        return f"pid {int(who['pid'])} on host {who['host']}, since {who['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


class RunLock:
    """The exclusive hold of one run folder: `acquire` or RunFolderBusy; `release` (or the process's end, even a
    kill -9: the kernel drops the lock with the file) lets the next server in."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Hold the folder, writing who holds it; RunFolderBusy naming the holder when a live process has it
        (ForeignLockFile when its lock file is not this user's)."""
        fd, held = open_locked(self.path, RETRY_S)
        if not held:
            holder = _describe(fd)
            os.close(fd)
            raise RunFolderBusy(
                f"{self.path.parent} is in use by another server ({holder}): one run folder takes one ServerApp "
                "at a time; wait for that run to end, or stop it, then resume"
            )
        who = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(who) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Let the folder go (a no-op when not held)."""
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # nobody holds it now: a stale name would mislead
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()


def holder(run_dir: Path) -> str | None:
    """Who holds the run folder now ('pid P on host H since T'), or None when nobody does (or it has no lock)."""
    path = Path(run_dir) / LOCK_FILE
    if not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if fcntl is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _describe(fd)
        return None  # closing the descriptor drops the shared lock just taken
    finally:
        os.close(fd)
