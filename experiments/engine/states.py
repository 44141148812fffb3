"""Client state between a node's messages on the in-process engine: each node's state lives in one shared-memory
block (its arrays back to back, with a small manifest), handed from the worker that wrote it to the worker that
runs the node's next message; the server process only holds the block's name. State reaches the client's state dir
(client-state-dir) when the server writes a checkpoint, so a killed run resumes as before, and when the blocks held
pass a memory budget (the least recently used are written out and let go; their nodes read them back from disk).
Compared with writing and reading a signed file per message, no file, signature, CRC or fsync is paid per round.

A state key whose arrays are views of immutable received bytes (a DM-PFL or FedDST client keeps the global model it
received, the same one as every client of the round) goes into a content block of its own, written once per worker
and payload; each state that holds it gets a hard link to that block (tmpfs frees the content with its last link),
so a thousand clients holding one global model hold one copy of it per worker, not a thousand."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from client_app.state import Kept, StateDir, Tree, immutable_root
from experiments.engine.blobs import SHM_DIR, BlobRef, drop, link, read_into, take, write

ALIGN = 64  # each array starts on a cache line
WRITERS = 4  # threads writing states to their state dirs at a checkpoint
MIN_BUDGET = 2 << 30  # bytes of state held in shared memory before the least recently used are written out: at
MEMORY_SHARE = 4  # least this, else a quarter of the machine's memory (or half of /dev/shm, when that is smaller)
CONTENT_FROM_BYTES = 64 << 10  # a key's immutable arrays this large go to a shared content block
KEPT_CONTENTS = 8  # content blocks a worker keeps its own link to, most recently used first

# state key, array name, dtype, shape, offset in its block, the block: -1 the state's own, else one of its contents
Entry = tuple[str, str, str, tuple[int, ...], int, int]


@dataclass(frozen=True)
class Content:
    """A state's link to a content block, and the block's identity (the name it was written under, never reused
    in a run: its bytes are counted once, and read once per process)."""

    ref: BlobRef
    origin: str


@dataclass(frozen=True)
class StateBlock:
    """A node's state as a message left it: its block, manifest and round; the last checkpoint the message named;
    its state dir (path, run, partition; None: memory only); whether the state dir lacks it (`dirty`)."""

    ref: BlobRef | None  # None: a state with no arrays of its own
    entries: tuple[Entry, ...]
    server_round: int
    checkpoint_round: int | None
    store: tuple[str, str, int, str] | None  # the StateDir's path, run, partition and run id
    dirty: bool
    contents: tuple[Content, ...] = ()

    def blocks(self) -> list[BlobRef]:
        """Every shared-memory name this state owns (its block, its links to content blocks)."""
        return ([] if self.ref is None else [self.ref]) + [content.ref for content in self.contents]


def _layout(named: dict[str, np.ndarray], key: str, part: int, start: int, entries: list[Entry]) -> tuple[list, int]:
    """Append the arrays' entries, laid out back to back from `start` in block `part`; their (offset, bytes) parts
    and the offset after them."""
    parts, offset = [], start
    for name, value in named.items():
        array = np.require(value, requirements="C")
        entries.append((key, name, array.dtype.str, tuple(array.shape), offset, part))
        if array.nbytes:
            parts.append((offset, array.reshape(-1).view(np.uint8).data))
        offset += -(-array.nbytes // ALIGN) * ALIGN
    return parts, offset


def _content_key(named: dict[str, np.ndarray]) -> tuple | None:
    """What tells a key's arrays apart when they are large views of immutable bytes (their names, addresses and
    forms: the bytes are kept alive while the key is cached, so an address cannot be reused); None otherwise."""
    if sum(a.nbytes for a in named.values()) < CONTENT_FROM_BYTES:
        return None
    key = []
    for name, array in named.items():
        if not array.flags.c_contiguous or immutable_root(array) is None:
            return None
        key.append((name, array.__array_interface__["data"][0], array.dtype.str, array.shape))
    return tuple(key)


class _Contents:
    """A worker's content blocks: its own link to each of the last KEPT_CONTENTS, by the arrays they hold (kept
    alive with them)."""

    def __init__(self) -> None:
        self._blocks: OrderedDict[tuple, tuple[Content, list[bytes]]] = OrderedDict()

    def find(self, key: tuple) -> Content | None:
        """This worker's link to the block holding these arrays, if it has one."""
        hit = self._blocks.get(key)
        if hit is None:
            return None
        self._blocks.move_to_end(key)
        return hit[0]

    def keep(self, key: tuple, content: Content, roots: list[bytes]) -> None:
        """Remember a link this worker holds (`roots`: the bytes the arrays are views of)."""
        self._blocks[key] = (content, roots)
        while len(self._blocks) > KEPT_CONTENTS:
            drop(self._blocks.popitem(last=False)[1][0].ref)

    def close(self) -> None:
        """Drop this worker's links (a block lives on while states link to it)."""
        while self._blocks:
            drop(self._blocks.popitem()[1][0].ref)


CONTENTS = _Contents()  # this process's (a worker's)


def _link_content(named: dict[str, np.ndarray], key: tuple) -> Content:
    """A new link to the content block holding these arrays: the worker's block when it has one, else a new one."""
    mine = CONTENTS.find(key)
    if mine is None:
        parts, size = _layout(named, "", 0, 0, [])
        ref = write(parts, size)
        mine = Content(ref, ref.name)
        CONTENTS.keep(key, mine, [root for a in named.values() if (root := immutable_root(a)) is not None])
    return Content(link(mine.ref), mine.origin)


def pack(kept: Kept) -> StateBlock:
    """Copy a kept state into a new shared-memory block (in the worker that ran the message); a key whose arrays
    are large views of immutable received bytes is linked to a content block instead."""
    entries: list[Entry] = []
    parts: list = []
    offset = 0
    contents: list[Content] = []
    for key, named in kept.tree.items():
        content_key = _content_key(named)
        if content_key is not None:
            _layout(named, key, len(contents), 0, entries)
            contents.append(_link_content(named, content_key))
        else:
            own, offset = _layout(named, key, -1, offset, entries)
            parts += own
    ref = write(parts, offset) if offset else None
    store = (
        None if kept.store is None else (str(kept.store.path), kept.store.run, kept.store.partition, kept.store.run_id)
    )
    return StateBlock(ref, tuple(entries), kept.server_round, kept.checkpoint_round, store, kept.dirty, tuple(contents))


def unpack(block: StateBlock, share: bool = False) -> Kept:
    """The state a block holds, read out of it (the block stays for the server to free). A content block's arrays
    come out as read-only views of one bytes object, as they went in; `share` (a worker): this process keeps a
    link to the block, so that the states it packs from those arrays link it too."""
    tree: Tree = {}
    parts = []
    for key, name, dtype, shape, offset, part in block.entries:
        if part >= 0:
            continue
        array = np.empty(shape, np.dtype(dtype))
        tree.setdefault(key, {})[name] = array
        if array.nbytes:
            parts.append((offset, array.reshape(-1).view(np.uint8).data))
    if parts:
        assert block.ref is not None
        read_into(block.ref, parts)
    for index, content in enumerate(block.contents):
        data = _content_bytes(content)
        key = ""
        for key, name, dtype, shape, offset, _ in (e for e in block.entries if e[5] == index):
            count = int(np.prod(shape, dtype=np.int64))
            tree.setdefault(key, {})[name] = np.frombuffer(data, np.dtype(dtype), count, offset).reshape(shape)
        content_key = _content_key(tree[key]) if share and key in tree else None
        if content_key is not None and CONTENTS.find(content_key) is None:
            CONTENTS.keep(content_key, Content(link(content.ref), content.origin), [data])
    store = None
    if block.store is not None:
        store = StateDir(Path(block.store[0]), run=block.store[1], partition=block.store[2], run_id=block.store[3])
    return Kept(block.server_round, tree, block.checkpoint_round, store, block.dirty)


_READ: OrderedDict[str, bytes] = OrderedDict()  # content blocks this process read, by origin (a few)
_READ_LOCK = threading.Lock()  # the server writes states to disk on several threads


def _content_bytes(content: Content) -> bytes:
    """A content block's bytes, read once per process while it is among the last few read."""
    with _READ_LOCK:
        data = _READ.get(content.origin)
        if data is not None:
            _READ.move_to_end(content.origin)
            return data
    data = take(content.ref, unlink=False)
    with _READ_LOCK:
        _READ[content.origin] = data
        while len(_READ) > KEPT_CONTENTS:
            _READ.popitem(last=False)
    return data


def forget_contents() -> None:
    """Drop this process's links to content blocks and the content it read (a worker starting for a run)."""
    CONTENTS.close()
    with _READ_LOCK:
        _READ.clear()


def budget() -> int:
    """Bytes of client state the engine keeps in shared memory: PFLOWER_STATE_MEMORY_MB, else a quarter of the
    machine's memory (half of /dev/shm's room if smaller), at least MIN_BUDGET."""
    value = os.environ.get("PFLOWER_STATE_MEMORY_MB", "")
    if value.isdigit():
        return int(value) << 20
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        shm = os.statvfs(SHM_DIR)
        room = shm.f_blocks * shm.f_frsize
    except (OSError, ValueError):
        return MIN_BUDGET
    return max(MIN_BUDGET, min(memory // MEMORY_SHARE, room // 2))


class HeldStates:
    """The server process's side: the newest state block of each node, least recently used first."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = budget() if limit is None else limit
        self._blocks: OrderedDict[int, StateBlock] = OrderedDict()
        self.held_bytes = 0  # own blocks, and each content block once
        self.written = 0  # states written to their state dirs (checkpoints, budget)
        self._linked: dict[str, int] = {}  # content block (origin) -> held states linking it

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
        for content in block.contents:
            self._linked[content.origin] = self._linked.get(content.origin, 0) + 1
            self.held_bytes += content.ref.size if self._linked[content.origin] == 1 else 0
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
            for ref in block.blocks():
                drop(ref)
            for content in block.contents:
                self._linked[content.origin] -= 1
                if not self._linked[content.origin]:
                    del self._linked[content.origin]
                    self.held_bytes -= content.ref.size

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
