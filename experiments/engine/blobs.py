"""Large array bytes between the engine's processes through shared memory instead of the pipe: the sender copies
them into a shared-memory block once, the receiver copies them out. A pipe moves a model in 64 KiB pieces with a
context switch each (most of the server's time at 100 clients a round); one block also serves every message that
carries the same array (FedAvg's global model goes to every client of a round: written once)."""

from __future__ import annotations

import fcntl
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

SHARED_FROM_BYTES = 64 << 10  # smaller payloads go through the pipe: a block costs a few system calls
SHM_DIR = Path("/dev/shm")  # POSIX shared memory on Linux: each block a file of this tmpfs, read and written in place
PREFIX_ENV = "PFLOWER_SHM_PREFIX"  # names every block of one engine run (the grid sets it for its workers)
_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class BlobRef:
    """Where a payload waits: a shared-memory block's name and the payload's length."""

    name: str
    size: int


def prefix() -> str:
    """The name prefix of this run's blocks."""
    return os.environ.get(PREFIX_ENV) or f"pfl{os.getpid()}-"


def _path(name: str) -> str:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"not a shared-memory block name: {name!r}")
    return str(SHM_DIR / name)


def write(parts: list[tuple[int, memoryview]], size: int) -> BlobRef:
    """A new block of `size` bytes holding each (offset, bytes) part; only this user may open it. Written with
    pwrite, not through a mapping: no page faults one by one, and no resource-tracker messages."""
    name = prefix() + secrets.token_hex(8)
    fd = os.open(_path(name), os.O_CREAT | os.O_EXCL | os.O_WRONLY | _FLAGS, 0o600)
    try:
        os.ftruncate(fd, size)
        for offset, data in parts:
            done = 0
            while done < len(data):
                done += os.pwrite(fd, data[done:], offset + done)
    except BaseException:
        os.close(fd)
        os.unlink(_path(name))
        raise
    os.close(fd)
    return BlobRef(name, size)


def link(ref: BlobRef) -> BlobRef:
    """A new name for a block's content (a hard link: the content is freed with its last name), for its new owner."""
    name = prefix() + secrets.token_hex(8)
    os.link(_path(ref.name), _path(name), follow_symlinks=False)
    return BlobRef(name, ref.size)


def put(data: bytes) -> BlobRef:
    """Copy `data` into a new shared-memory block; the receiver (or the sender, with `drop`) frees it."""
    return write([(0, memoryview(data))], len(data))


def read_into(ref: BlobRef, parts: list[tuple[int, memoryview]]) -> None:
    """Fill each writable buffer from the block at its offset."""
    fd = os.open(_path(ref.name), os.O_RDONLY | _FLAGS)
    try:
        for offset, buffer in parts:
            done = 0
            while done < len(buffer):
                got = os.preadv(fd, [buffer[done:]], offset + done)
                if got == 0:
                    raise EOFError(f"shared-memory block {ref.name} ends before byte {offset + len(buffer)}")
                done += got
    finally:
        os.close(fd)


def take(ref: BlobRef, unlink: bool) -> bytes:
    """The payload of a block (copied out); `unlink` frees the block too (its last reader)."""
    fd = os.open(_path(ref.name), os.O_RDONLY | _FLAGS)
    try:
        pieces = [os.pread(fd, ref.size, 0)]
        done = len(pieces[0])
        while done < ref.size:  # a read returns less only past the kernel's per-call limit (2 GiB)
            pieces.append(os.pread(fd, ref.size - done, done))
            if not pieces[-1]:
                raise EOFError(f"shared-memory block {ref.name} holds fewer than {ref.size} bytes")
            done += len(pieces[-1])
    finally:
        os.close(fd)
    if unlink:
        drop(ref)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def drop(ref: BlobRef) -> None:
    """Free a block (nothing if it is gone)."""
    try:
        os.unlink(_path(ref.name))
    except FileNotFoundError:
        pass


LOCK_SUFFIX = "lock"  # `<prefix>lock`: the file a live run holds an flock on for as long as its blocks may be used


def hold_run_lock(name_prefix: str) -> int:
    """Make and lock the file that marks a run's blocks as in use (`<prefix>lock`, 0600, never through a link); the
    caller keeps the returned descriptor open for the run and gives it to `release_run_lock` at the end. Another
    process, in this PID namespace or another, tells the run's blocks orphaned by taking that lock, not by its PID."""
    fd = os.open(_path(name_prefix + LOCK_SUFFIX), os.O_CREAT | os.O_EXCL | os.O_RDWR | _FLAGS, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def release_run_lock(name_prefix: str, fd: int) -> None:
    """Remove a run's lock file and close its descriptor (the run's blocks are freed before)."""
    try:
        os.unlink(_path(name_prefix + LOCK_SUFFIX))
    except FileNotFoundError:
        pass
    os.close(fd)


def _mine(path: Path) -> bool:
    """Whether `path` is a regular file of this user's (another user's block is never read, freed or waited on)."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid()


def sweep_orphans() -> int:
    """Free this user's blocks of engine runs that are gone (a run killed with SIGKILL could not free its own): a
    run is gone when its lock file can be locked, whatever its PID says (a run in another PID namespace shares the
    folder); blocks of no lock file and other users' files are left alone. Returns how many files it freed."""
    freed = 0
    for lock in SHM_DIR.glob(f"pfl*-{LOCK_SUFFIX}"):
        if not _mine(lock):
            continue
        try:
            fd = os.open(lock, os.O_RDONLY | _FLAGS)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: the run is alive
            os.close(fd)
            continue
        try:
            name_prefix = lock.name[: -len(LOCK_SUFFIX)]
            freed += sweep(name_prefix, keep=lock.name)
            lock.unlink(missing_ok=True)
            freed += 1
        finally:
            os.close(fd)
    return freed


def sweep(name_prefix: str, keep: str = "") -> int:
    """Free every block of this user's whose name starts with `name_prefix` (what a run's processes left behind: a
    worker that died mid-message), all but `keep`; returns how many."""
    freed = 0
    for path in SHM_DIR.glob(f"{name_prefix}*") if name_prefix else []:
        if path.name == keep or not _mine(path):
            continue
        try:
            path.unlink()
        except OSError:  # gone meanwhile
            continue
        freed += 1
    return freed


class SharedArrays:
    """The sender's side for messages to workers: one block per distinct payload object, shared by every message
    that carries it. A block whose messages are all answered stays while its payload is one of the `KEPT_IDLE` most
    recent idle ones: the sliding window of messages-in-flight sends one round's payload in many batches, and a
    block freed between two batches would be written again."""

    KEPT_IDLE = 4

    def __init__(self) -> None:
        self._blocks: dict[int, tuple[bytes, BlobRef]] = {}  # id(payload) -> the payload (kept alive), its block
        self._users: dict[str, int] = {}  # block name -> messages not answered yet
        self._key: dict[str, int] = {}  # block name -> id(payload)
        self._idle: list[str] = []  # blocks without users, oldest first

    def share(self, data: bytes) -> BlobRef:
        """The block holding `data` (made on first use); the caller must `release` it once per `share`."""
        key = id(data)
        if key not in self._blocks:
            ref = put(data)
            self._blocks[key] = (data, ref)
            self._users[ref.name], self._key[ref.name] = 0, key
        ref = self._blocks[key][1]
        if ref.name in self._idle:
            self._idle.remove(ref.name)
        self._users[ref.name] += 1
        return ref

    def release(self, refs: list[BlobRef]) -> None:
        """One user of each block is done; a block with no users left joins the idle ones, and the oldest idle
        blocks beyond `KEPT_IDLE` are freed."""
        for ref in refs:
            if ref.name not in self._users:
                continue
            self._users[ref.name] -= 1
            if self._users[ref.name] <= 0 and ref.name not in self._idle:
                self._idle.append(ref.name)
        while len(self._idle) > self.KEPT_IDLE:
            name = self._idle.pop(0)
            del self._users[name]
            _, ref = self._blocks.pop(self._key.pop(name))
            drop(ref)

    def close(self) -> None:
        """Free every block."""
        for _, ref in self._blocks.values():
            drop(ref)
        self._blocks.clear()
        self._users.clear()
        self._key.clear()
        self._idle.clear()
