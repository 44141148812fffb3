"""Crash-safe files: atomic writes, and nested state (arrays + JSON) packed into one .npz read without pickle."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

META_KEY = "__meta__"


class StateFileError(ValueError):
    """A state or checkpoint file that cannot be read back; the message names the file and the reason."""


CHECKPOINT_FILE = "checkpoint.npz"  # a run folder's server checkpoint (server_app/checkpoint.py writes it)


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


def save_tree(path: Path, tree: Any) -> int:
    """Pack `tree` into an .npz written atomically (streamed to disk, no copy in memory); returns its size."""
    with atomic_file(path) as fh:
        np.savez(fh, allow_pickle=False, **pack(tree))
        size = fh.tell()
    return size


def load_tree(path: Path) -> Any:
    """Read a file written by `save_tree` (numpy arrays only: pickled objects are refused)."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
        return unpack(arrays)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise StateFileError(f"{path}: not a readable state file ({exc})") from None
