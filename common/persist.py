"""Crash-safe files: atomic writes, and nested state (arrays + JSON) packed into one .npz read without pickle."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, BinaryIO

import numpy as np

from .pages import row_blocks

META_KEY = "__meta__"


class StateFileError(ValueError):
    """A state or checkpoint file that cannot be read back; the message names the file and the reason."""


CHECKPOINT_FILE = "checkpoint.npz"  # a run folder's server checkpoint (server_app/checkpoint.py writes it)
CLIENT_STATE_FOLDER = "client-state"  # a run folder's simulated clients' state (client-state-dir=auto)


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A file handle whose content replaces `path` only once it is complete and on disk: a crash leaves
    either the old file or the new one, never a torn one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically (see atomic_file)."""
    with atomic_file(path) as fh:
        fh.write(data)


def atomic_write_text(path: Path, text: str) -> None:
    """atomic_write_bytes for UTF-8 text."""
    atomic_write_bytes(path, text.encode())


def pack(tree: Any) -> dict[str, np.ndarray]:
    """Nested dicts (str keys) / lists of numpy arrays and JSON scalars -> flat arrays, the shape in META_KEY."""
    arrays: dict[str, np.ndarray] = {}

    def walk(node: Any) -> Any:
        if isinstance(node, np.ndarray):
            if node.dtype == object:
                raise TypeError("object arrays cannot be stored")
            key = f"a{len(arrays)}"
            arrays[key] = node
            return {"__array__": key}
        if isinstance(node, dict):
            if not all(isinstance(k, str) for k in node):
                raise TypeError("state dict keys must be strings")
            return {"__dict__": {k: walk(v) for k, v in node.items()}}
        if isinstance(node, (list, tuple)):
            return [walk(v) for v in node]
        if isinstance(node, (np.integer, np.floating, np.bool_)):
            return node.item()
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        raise TypeError(f"cannot store a {type(node).__name__}")

    skeleton = walk(tree)
    arrays[META_KEY] = np.frombuffer(json.dumps(skeleton).encode(), dtype=np.uint8)
    return arrays


def unpack(arrays: dict[str, np.ndarray]) -> Any:
    """Inverse of `pack`."""
    skeleton = json.loads(bytes(arrays[META_KEY]).decode())

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if "__array__" in node:
                return arrays[node["__array__"]]
            return {k: walk(v) for k, v in node["__dict__"].items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return walk(skeleton)


def _write_npy(entry: IO[bytes], array: np.ndarray) -> None:
    """One array in .npy format; a memory-mapped one row block by row block, its pages released as it goes (a
    server's store of 1,000 client models would otherwise become resident in full)."""
    if not isinstance(array, np.memmap) or not array.flags.c_contiguous or array.ndim == 0:
        np.lib.format.write_array(entry, array, allow_pickle=False)
        return
    np.lib.format.write_array_header_1_0(entry, np.lib.format.header_data_from_array_1_0(array))
    for block in row_blocks(array):
        entry.write(block.reshape(-1).view(np.uint8).data)  # bytes: zipfile counts len() of what it writes


def save_tree(path: Path, tree: Any) -> int:
    """Pack `tree` into an .npz (uncompressed, as np.savez writes it) written atomically and streamed to disk, with no
    copy in memory; returns its size."""
    with atomic_file(path) as fh:
        with zipfile.ZipFile(fh, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
            for key, array in pack(tree).items():
                with archive.open(f"{key}.npy", "w", force_zip64=True) as entry:
                    _write_npy(entry, array)
        size = fh.tell()
    return size


def _mapped_member(path: Path, archive: zipfile.ZipFile, name: str) -> np.ndarray | None:
    """A stored (uncompressed) .npy member of an .npz memory-mapped copy-on-write in place, or None when it cannot
    be (compressed, object dtype, sizes that do not add up)."""
    info = archive.getinfo(name)
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        local = fh.read(30)
        if len(local) != 30 or local[:4] != b"PK\x03\x04":
            return None
        data_start = (
            info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
        )
        fh.seek(data_start)
        version = np.lib.format.read_magic(fh)
        readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in readers:
            return None
        shape, fortran, dtype = readers[version](fh)
        offset = fh.tell()
    if dtype.hasobject or offset - data_start + int(np.prod(shape)) * dtype.itemsize != info.file_size:
        return None
    return np.memmap(path, dtype=dtype, mode="c", offset=offset, shape=shape, order="F" if fortran else "C")


def load_tree(path: Path, map_from_bytes: int | None = None) -> Any:
    """Read a file written by `save_tree` (numpy arrays only: pickled objects are refused). Arrays of at least
    `map_from_bytes` are memory-mapped copy-on-write from the file instead of read into memory."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {}
            for key in npz.files:
                info = npz.zip.getinfo(f"{key}.npy")
                mapped = (
                    _mapped_member(Path(path), npz.zip, f"{key}.npy")
                    if map_from_bytes is not None and info.file_size >= map_from_bytes
                    else None
                )
                arrays[key] = mapped if mapped is not None else npz[key]
        return unpack(arrays)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise StateFileError(f"{path}: not a readable state file ({exc})") from None
