"""Memory-mapped float32 stores kept out of resident memory: pages released after use, column blocks read by
pread, row blocks of bounded size."""

from __future__ import annotations

import mmap
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import numpy as np

# Bytes of a memory-mapped store's rows handled at a time by row_blocks.
_RESIDENT_BYTES = 256 << 20
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
    taken from `blocks` ahead of the result being yielded (so column_blocks(..., buffers=threads) is safe).

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


def column_blocks(
    W: np.ndarray, width: int, buffers: int = 1, rows: Sequence[int] | None = None
) -> Iterator[tuple[int, np.ndarray]]:
    """(start, W[:, start:start + width]) for consecutive column blocks (only the given `rows` of it, in their
    order, when given).

    A memory-mapped store's blocks are read with pread into `buffers` scratch blocks in turn, never through the
    mapping: the kernel maps a file's pages in large folios (~2 MB here), so touching a few columns of every row
    through the mapping would make the whole store resident. A block's scratch is overwritten `buffers` blocks
    later: be done with it before asking for that one.
    """
    located = store_file(W)
    picked = None if rows is None else np.asarray(rows, dtype=np.int64)
    if located is None:
        for start in range(0, W.shape[1], width):
            yield start, (W[:, start : start + width] if picked is None else W[picked, start : start + width])
        return
    path, offset = located
    cols = W.shape[1]
    read = range(W.shape[0]) if picked is None else [int(r) for r in picked]
    scratches = [np.empty((len(read), min(width, cols)), dtype=np.float32) for _ in range(max(1, buffers))]
    with open(path, "rb", buffering=0) as fh:
        for index, start in enumerate(range(0, cols, width)):
            block = scratches[index % len(scratches)][:, : min(width, cols - start)]
            nbytes = block.shape[1] * 4
            for at, row in enumerate(read):
                position = offset + (row * cols + start) * 4
                if os.preadv(fh.fileno(), [memoryview(block[at])], position) != nbytes:
                    raise OSError(f"{path}: short read of row {row} of the model store")
            yield start, block


def row_blocks(W: np.ndarray, rows: np.ndarray | None = None) -> Iterator[np.ndarray]:
    """The given rows of W (all when None) as consecutive blocks of at most ~256 MB; a memory-mapped store's pages
    are released after each block."""
    picked = np.arange(W.shape[0]) if rows is None else np.asarray(rows, dtype=np.int64)
    step = max(1, _RESIDENT_BYTES // max(W.shape[1] * W.itemsize, 1))
    for start in range(0, len(picked), step):
        part = picked[start : start + step]
        yield W[part[0] : part[-1] + 1] if rows is None else W[part]
        release_pages(W)
