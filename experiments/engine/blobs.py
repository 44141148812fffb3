"""Large array bytes between the engine's processes through shared memory instead of the pipe: the sender copies
them into a shared-memory block once, the receiver copies them out. A pipe moves a model in 64 KiB pieces with a
context switch each (most of the server's time at 100 clients a round); one block also serves every message that
carries the same array (FedAvg's global model goes to every client of a round: written once)."""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing import shared_memory

SHARED_FROM_BYTES = 64 << 10  # smaller payloads go through the pipe: a block costs two system calls


@dataclass(frozen=True)
class BlobRef:
    """Where a payload waits: a shared-memory block's name and the payload's length."""

    name: str
    size: int


def put(data: bytes) -> BlobRef:
    """Copy `data` into a new shared-memory block; the receiver (or the sender, with `drop`) unlinks it."""
    block = shared_memory.SharedMemory(create=True, size=max(1, len(data)))
    try:
        assert block.buf is not None
        block.buf[: len(data)] = data
        return BlobRef(block.name, len(data))
    finally:
        block.close()


def take(ref: BlobRef, unlink: bool) -> bytes:
    """The payload of a block (copied out); `unlink` frees the block too (its last reader)."""
    block = shared_memory.SharedMemory(name=ref.name)
    try:
        assert block.buf is not None
        return bytes(block.buf[: ref.size])
    finally:
        block.close()
        if unlink:
            block.unlink()


def drop(ref: BlobRef) -> None:
    """Free a block nobody will read (a message given up on)."""
    try:
        block = shared_memory.SharedMemory(name=ref.name)
    except FileNotFoundError:
        return
    block.close()
    block.unlink()


class SharedArrays:
    """The sender's side for messages to workers: one block per distinct payload object, shared by every message
    that carries it, freed when the last of those messages is answered."""

    def __init__(self) -> None:
        self._blocks: dict[int, tuple[bytes, BlobRef]] = {}  # id(payload) -> the payload (kept alive), its block
        self._users: dict[str, int] = {}  # block name -> messages not answered yet
        self._key: dict[str, int] = {}  # block name -> id(payload)

    def share(self, data: bytes) -> BlobRef:
        """The block holding `data` (made on first use); the caller must `release` it once per `share`."""
        key = id(data)
        if key not in self._blocks:
            ref = put(data)
            self._blocks[key] = (data, ref)
            self._users[ref.name], self._key[ref.name] = 0, key
        ref = self._blocks[key][1]
        self._users[ref.name] += 1
        return ref

    def release(self, refs: list[BlobRef]) -> None:
        """One user of each block is done; a block with no users left is freed."""
        for ref in refs:
            if ref.name not in self._users:
                continue
            self._users[ref.name] -= 1
            if self._users[ref.name] <= 0:
                del self._users[ref.name]
                del self._blocks[self._key.pop(ref.name)]
                drop(ref)

    def close(self) -> None:
        """Free every block."""
        for _, ref in self._blocks.values():
            drop(ref)
        self._blocks.clear()
        self._users.clear()
        self._key.clear()
