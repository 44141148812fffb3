"""Memory-mapped float32 stores kept out of resident memory: pages released after use, column blocks read by
pread, row blocks of bounded size."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

import numpy as np

# Bytes of a memory-mapped store's rows handled at a time by row_blocks.
_RESIDENT_BYTES = 256 << 20


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
    if (isinstance(W, np.memmap) and isinstance(W.base, mmap.mmap) and W.filename is not None
            and W.flags.c_contiguous and W.dtype == np.float32):
        return str(W.filename), int(W.offset)
    return None


def column_blocks(W: np.ndarray, width: int) -> Iterator[tuple[int, np.ndarray]]:
    """(start, W[:, start:start + width]) for consecutive column blocks.

    A memory-mapped store's blocks are read with pread into one scratch block, never through the mapping: the
    kernel maps a file's pages in large folios (~2 MB here), so touching a few columns of every row through the
    mapping would make the whole store resident. The scratch block is overwritten by the next one: use each block
    before asking for the next.
    """
    located = store_file(W)
    if located is None:
        for start in range(0, W.shape[1], width):
            yield start, W[:, start:start + width]
        return
    path, offset = located
    rows, cols = W.shape
    scratch = np.empty((rows, width), dtype=np.float32)
    with open(path, "rb", buffering=0) as fh:
        for start in range(0, cols, width):
            block = scratch[:, :min(width, cols - start)]
            nbytes = block.shape[1] * 4
            for row in range(rows):
                position = offset + (row * cols + start) * 4
                if os.preadv(fh.fileno(), [memoryview(block[row])], position) != nbytes:
                    raise OSError(f"{path}: short read of row {row} of the model store")
            yield start, block


def row_blocks(W: np.ndarray, rows: np.ndarray | None = None) -> Iterator[np.ndarray]:
    """The given rows of W (all when None) as consecutive blocks of at most ~256 MB; a memory-mapped store's pages
    are released after each block."""
    picked = np.arange(W.shape[0]) if rows is None else np.asarray(rows, dtype=np.int64)
    step = max(1, _RESIDENT_BYTES // max(W.shape[1] * W.itemsize, 1))
    for start in range(0, len(picked), step):
        part = picked[start:start + step]
        yield W[part[0]:part[-1] + 1] if rows is None else W[part]
        release_pages(W)
