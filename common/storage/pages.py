"""Memory-mapped float32 stores kept out of resident memory: pages released after use, column blocks read by
pread, row blocks of bounded size."""

from __future__ import annotations

import mmap
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import numpy as np

# Bytes of a memory-mapped store's rows handled at a time by row_blocks.
_RESIDENT_BYTES = 256 << 20
# A store's columns are read (pread) this many bytes of a row at a time at least, into at most this much scratch a
# thread.
_READ_ROW_BYTES, _READ_SCRATCH_BYTES = 64 << 10, 64 << 20
# Threads for block products (each on a one-thread BLAS): the cores the process may use, at most this many.
_MAX_BLOCK_THREADS = 8

T = TypeVar("T")
R = TypeVar("R")


class StoreSpaceError(OSError):
    """The disk could not hold a new memory-mapped store."""


def new_store(path: Path, dtype: type[np.generic], shape: tuple[int, ...]) -> np.memmap:
    """A new zero-filled memory-mapped .npy file at `path`, its disk space reserved before any page is written.

    Without the reservation the file is sparse, and a write to a page the full disk cannot back kills the process
    with SIGBUS (no exception, no log line); reserved, a full disk is a StoreSpaceError here and the file is removed.
    """
    store = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    size = os.path.getsize(path)
    try:
        with open(path, "r+b") as fh:
            os.posix_fallocate(fh.fileno(), 0, size)
    except OSError as exc:
        del store
        Path(path).unlink(missing_ok=True)
        raise StoreSpaceError(
            exc.errno,
            f"cannot reserve {size / 1e6:,.1f} MB on disk for {path} "
            f"({exc.strerror}); free some space or point results-dir elsewhere",
        ) from None
    return store


def block_threads() -> int:
    """Threads `map_blocks` uses: the cores this process may run on (at most 8)."""
    return max(1, min(_MAX_BLOCK_THREADS, len(os.sched_getaffinity(0))))


def map_blocks(work: Callable[[T], R], blocks: Iterable[T], threads: int) -> Iterator[R]:
    """work(block) for each block, on `threads` threads, results in the blocks' order; at most `threads` blocks are
    taken from `blocks` ahead of the result being yielded (so `threads` scratch buffers reused in turn are safe).

    Each block's work is done whole by one thread, so with a one-thread BLAS (the server's) the numbers are the same
    for any thread count: the split is the blocks', fixed by the caller, not the machine's.
    """
    if threads <= 1:
        yield from map(work, blocks)
        return
    with ThreadPoolExecutor(max_workers=threads) as pool:
        pending: deque[Future[R]] = deque()
        for block in blocks:
            pending.append(pool.submit(work, block))
            if len(pending) == threads:  # before the next block reuses the oldest's scratch
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def release_pages(W: np.ndarray) -> None:
    """Drop a memory-mapped store's pages from this process's resident memory (no-op for an in-memory array).

    The data stays in the file and the page cache (dirty pages are written back, not lost): without this, every
    row ever read or written stays counted in the process's RSS, up to the whole store (6.6 GB at 1,000 clients).
    """
    mapping = getattr(W, "_mmap", None)  # numpy keeps the mmap of a memmap (and of its views) here
    if isinstance(mapping, mmap.mmap):
        mapping.madvise(mmap.MADV_DONTNEED)


def store_file(W: np.ndarray) -> tuple[str, int] | None:
    """(file, byte offset) of a whole memory-mapped float32 store (as model_store makes it), else None."""
    if (
        isinstance(W, np.memmap)
        and isinstance(W.base, mmap.mmap)
        and W.filename is not None
        and W.flags.c_contiguous
        and W.dtype == np.float32
    ):
        return str(W.filename), int(W.offset)
    return None


def map_column_blocks(
    work: Callable[[tuple[int, np.ndarray]], R],
    W: np.ndarray,
    width: int,
    threads: int,
    rows: Sequence[int] | None = None,
) -> Iterator[R]:
    """work((start, W[:, start:start + width])) for W's consecutive column blocks (only the given `rows` of it, in
    their order, when given), on `threads` threads, results in the blocks' order.

    A memory-mapped store's columns are read with pread by the thread that works on them, never through the mapping
    (the kernel maps a file's pages in large folios, ~2 MB here, so touching a few columns of every row through it
    would make the whole store resident). A read takes several consecutive blocks' columns of a row at once (a few
    KB a call cost more in calls than in copying), each block still handed to `work` on its own: the blocks, and so
    any sums over them, do not change. A block's array is the thread's scratch: `work` must be done with it when it
    returns.
    """
    located = store_file(W)
    picked = None if rows is None else np.asarray(rows, dtype=np.int64)
    cols = W.shape[1]
    if located is None:
        views = (
            (start, W[:, start : start + width] if picked is None else W[picked, start : start + width])
            for start in range(0, cols, width)
        )
        yield from map_blocks(work, views, threads)
        return
    path, offset = located
    read = list(range(W.shape[0])) if picked is None else [int(r) for r in picked]
    row_bytes = width * 4
    group = max(1, min(_READ_ROW_BYTES // row_bytes, _READ_SCRATCH_BYTES // max(len(read) * row_bytes, 1)))
    local = threading.local()

    def read_and_work(span: tuple[int, int]) -> list[R]:
        first, stop = span
        scratch = getattr(local, "scratch", None)
        if scratch is None:
            scratch = local.scratch = np.empty((len(read), min(group * width, cols)), dtype=np.float32)
        columns = scratch[:, : stop - first]
        nbytes = columns.shape[1] * 4
        for at, row in enumerate(read):
            if os.preadv(fd, [memoryview(columns[at])], offset + (row * cols + first) * 4) != nbytes:
                raise OSError(f"{path}: short read of row {row} of the model store")
        return [
            work((start, columns[:, start - first : min(start + width, stop) - first]))
            for start in range(first, stop, width)
        ]

    spans = [(first, min(first + group * width, cols)) for first in range(0, cols, group * width)]
    with open(path, "rb", buffering=0) as fh:
        fd = fh.fileno()
        for results in map_blocks(read_and_work, spans, threads):
            yield from results


def row_blocks(W: np.ndarray, rows: np.ndarray | None = None) -> Iterator[np.ndarray]:
    """The given rows of W (all when None) as consecutive blocks of at most ~256 MB; a memory-mapped store's pages
    are released after each block."""
    picked = np.arange(W.shape[0]) if rows is None else np.asarray(rows, dtype=np.int64)
    step = max(1, _RESIDENT_BYTES // max(W.shape[1] * W.itemsize, 1))
    for start in range(0, len(picked), step):
        part = picked[start : start + step]
        yield W[part[0] : part[-1] + 1] if rows is None else W[part]
        release_pages(W)
