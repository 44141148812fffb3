"""Client state between a node's messages on the in-process engine: each node's state lives in one shared-memory
block (its arrays back to back, with a small manifest), handed from the worker that wrote it to the worker that
runs the node's next message; the server process only holds the block's name. State reaches the client's state dir
(client-state-dir) when the server writes a checkpoint, so a killed run resumes as before, and when the blocks held
pass a memory budget (the least recently used are written out and let go; their nodes read them back from disk).
Compared with writing and reading a signed file per message, no file, signature, CRC or fsync is paid per round."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from client_app.state import Kept, StateDir, Tree
from experiments.engine.blobs import BlobRef, drop, read_into, write

ALIGN = 64  # each array starts on a cache line
WRITERS = 4  # threads writing states to their state dirs at a checkpoint
DEFAULT_BUDGET = 2 << 30  # bytes of state held in shared memory before the least recently used are written out

Entry = tuple[str, str, str, tuple[int, ...], int]  # state key, array name, dtype, shape, offset in the block


@dataclass(frozen=True)
class StateBlock:
    """A node's state as a message left it: its block, manifest and round; the last checkpoint the message named;
    its state dir (path, run, partition; None: memory only); whether the state dir lacks it (`dirty`)."""

    ref: BlobRef | None  # None: a state with no arrays
    entries: tuple[Entry, ...]
    server_round: int
    checkpoint_round: int | None
    store: tuple[str, str, int, str] | None  # the StateDir's path, run, partition and run id
    dirty: bool


def pack(kept: Kept) -> StateBlock:
    """Copy a kept state into a new shared-memory block (in the worker that ran the message)."""
    entries, parts, offset = [], [], 0
    for key, named in kept.tree.items():
        for name, value in named.items():
            array = np.require(value, requirements="C")
            entries.append((key, name, array.dtype.str, tuple(array.shape), offset))
            if array.nbytes:
                parts.append((offset, array.reshape(-1).view(np.uint8).data))
            offset += -(-array.nbytes // ALIGN) * ALIGN
    ref = write(parts, offset) if offset else None
    store = (
        None if kept.store is None else (str(kept.store.path), kept.store.run, kept.store.partition, kept.store.run_id)
    )
    return StateBlock(ref, tuple(entries), kept.server_round, kept.checkpoint_round, store, kept.dirty)


def unpack(block: StateBlock) -> Kept:
    """The state a block holds, read out of it (the block stays for the server to free)."""
    tree: Tree = {}
    parts = []
    for key, name, dtype, shape, offset in block.entries:
        array = np.empty(shape, np.dtype(dtype))
        tree.setdefault(key, {})[name] = array
        if array.nbytes:
            parts.append((offset, array.reshape(-1).view(np.uint8).data))
    if parts:
        assert block.ref is not None
        read_into(block.ref, parts)
    store = None
    if block.store is not None:
        store = StateDir(Path(block.store[0]), run=block.store[1], partition=block.store[2], run_id=block.store[3])
    return Kept(block.server_round, tree, block.checkpoint_round, store, block.dirty)


def budget() -> int:
    """Bytes of client state the engine keeps in shared memory (PFLOWER_STATE_MEMORY_MB overrides the default)."""
    value = os.environ.get("PFLOWER_STATE_MEMORY_MB", "")
    return int(value) << 20 if value.isdigit() else DEFAULT_BUDGET


class HeldStates:
    """The server process's side: the newest state block of each node, least recently used first."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = budget() if limit is None else limit
        self._blocks: OrderedDict[int, StateBlock] = OrderedDict()
        self.held_bytes = 0
        self.written = 0  # states written to their state dirs (checkpoints, budget)

    def get(self, node: int) -> StateBlock | None:
        """The node's state block, if the engine holds one (it becomes the most recently used)."""
        block = self._blocks.get(node)
        if block is not None:
            self._blocks.move_to_end(node)
        return block

    def put(self, node: int, block: StateBlock, busy: Collection[int] = ()) -> None:
        """The node's new state (its old block freed); over the budget, the least recently used others go to disk,
        except `busy` nodes (a message in flight may still read its block) and memory-only ones (nowhere to go)."""
        self.discard(node)
        self._blocks[node] = block
        self.held_bytes += _size(block)
        for other in list(self._blocks):
            if self.held_bytes <= self.limit:
                break
            if other != node and other not in busy and self._blocks[other].store is not None:
                self.written += self.write(other)
                self.discard(other)

    def discard(self, node: int) -> None:
        """Free the node's block (its state is no longer needed, or lives on disk)."""
        block = self._blocks.pop(node, None)
        if block is not None:
            self.held_bytes -= _size(block)
            if block.ref is not None:
                drop(block.ref)

    def write(self, node: int, checkpoint_round: int | None = None) -> bool:
        """Write the node's state to its state dir if the dir lacks it (`checkpoint_round`: the server's last
        checkpoint, which says which older versions a resume may still need); whether it wrote."""
        block = self._blocks.get(node)
        if block is None or not block.dirty or block.store is None:
            return False
        kept = unpack(block)
        assert kept.store is not None
        rounds = [r for r in (block.checkpoint_round, checkpoint_round) if r is not None]
        kept.store.save(kept.server_round, kept.tree, max(rounds) if rounds else None, durable=False)  # synced next
        self._blocks[node] = replace(block, dirty=False)
        return True

    def write_all(self, checkpoint_round: int | None) -> None:
        """Write every state its state dir lacks (before the server writes a checkpoint), on a few threads: copying,
        hashing and writing release the GIL."""
        nodes = [node for node, block in self._blocks.items() if block.dirty and block.store is not None]
        with ThreadPoolExecutor(max_workers=WRITERS) as pool:
            self.written += sum(pool.map(lambda node: self.write(node, checkpoint_round), nodes))

    def close(self) -> None:
        """Free every block."""
        for node in list(self._blocks):
            self.discard(node)


def _size(block: StateBlock) -> int:
    return 0 if block.ref is None else block.ref.size
