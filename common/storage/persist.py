"""Crash-safe files: atomic writes, and nested state (arrays + JSON) packed into one .npz read without pickle,
signed with HMAC-SHA256 under a key only its writer can read."""

from __future__ import annotations

import ctypes
import errno
import hashlib
import hmac
import io
import json
import os
import secrets
import stat
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, BinaryIO

import numpy as np

from common.storage.pages import row_blocks

META_KEY = "__meta__"


class StateFileError(ValueError):
    """A state or checkpoint file that cannot be read back; the message names the file and the reason."""


# A signed file's zip comment, its last bytes: this prefix, then the HMAC-SHA256 (hex) of its context (what the file
# is: kind, run, partition, round; length-prefixed) and every byte before the hex.
# Hex never contains the zip end-of-directory signature ("PK\x05\x06"), so zipfile cannot mistake it for one.
SIGNATURE_PREFIX = b"hmac-sha256:"
SIGNATURE_HEX = 64
KEY_BYTES = 32
_CHUNK = 8 << 20
_NPY_HEADER_MAX = 65536 + 16  # a .npy header (format 1.0 caps it at 64 KiB); a longer one is read, not mapped
# os.link's errors on file systems without hard links (FAT, some SMB shares, some FUSE mounts)
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS})

CHECKPOINT_FILE = "checkpoint.npz"  # a run folder's server checkpoint (server_app/checkpoint.py writes it)
CLIENT_STATE_FOLDER = "client-state"  # a run folder's simulated clients' state (client-state-dir=auto)


PRIVATE_FILE = 0o600  # what the project writes: readable by its user alone (personal models, masks, metrics)
PRIVATE_FOLDER = 0o700


def private_folder(path: Path) -> Path:
    """The folder `path`, made if missing with each missing parent 0700 (another local user cannot list or read
    what a run keeps there); an existing folder is left as it is."""
    path = Path(path)
    missing = []
    probe = path
    while not probe.exists() and not probe.is_symlink() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_FOLDER)
        except FileExistsError:  # made meanwhile by another process
            pass
    return path


def append_text(path: Path, text: str) -> None:
    """Append `text` to `path` (made 0600 if missing), never through a symbolic link planted in its place."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, PRIVATE_FILE)
    with os.fdopen(fd, "a") as fh:
        fh.write(text)


def open_for_append(path: Path) -> IO[str]:
    """A text handle appending to `path` (made 0600 if missing), never through a symbolic link (a log the caller
    keeps open)."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, PRIVATE_FILE), "a")


@contextmanager
def atomic_file(path: Path, durable: bool = True) -> Iterator[BinaryIO]:
    """A file handle whose content replaces `path` only once it is complete (and, when `durable`, on disk): a
    crash of the process leaves either the old file or the new one, never a torn one; with `durable` so does a
    power cut. The temporary file has a random name and is made 0600, exclusively and never through a link; the
    rename replaces a link at `path` rather than following it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(8)}")
    try:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE)
        with os.fdopen(fd, "w+b") as fh:  # readable too: save_tree signs what it wrote
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if not durable:
        return
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


def signing_key(path: Path, create: bool = True) -> bytes:
    """The secret key in `path` (made on first use when `create`); StateFileError unless it is a private file of
    this user's (a key someone else could read, or had put in place of ours, signs nothing)."""
    path = Path(path)
    if create and not os.path.lexists(path):
        _create_key(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise StateFileError(f"{path}: the key that signs these files is missing") from None
    except OSError as exc:
        raise StateFileError(f"{path}: key file unreadable ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        key = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise StateFileError(f"{path}: key file refused: it must be a file of this user's with mode 0600")
    if len(key) != KEY_BYTES:
        raise StateFileError(f"{path}: key file refused: it does not hold a {KEY_BYTES}-byte key")
    return key


def _create_key(path: Path) -> None:
    """A random key at `path`, mode 0600, complete before it appears (made in place where hard links are not
    supported); where two processes make it at once, both end up with the one made first."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = os.urandom(KEY_BYTES)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{os.urandom(4).hex()}")
        write_new(tmp, key)
        try:
            os.link(tmp, path)  # never replaces a key another process made meanwhile
        except FileExistsError:
            pass
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            # No hard links here: made in place, so a process reading it in the instant before its bytes are
            # written is refused (a short key) rather than handed an incomplete one.
            try:
                write_new(path, key)
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise StateFileError(f"{path}: cannot create the key file ({exc})") from None


def sync_file_system(path: Path) -> None:
    """Everything written so far to the file system holding `path` reaches the disk (syncfs where the C library
    has it, else a sync of every file system): one barrier for many files written without fsync."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        os.sync()
        return
    try:
        syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def write_new(path: Path, data: bytes) -> None:
    """`data` in a new file of mode 0600 on disk (FileExistsError if `path` exists); nothing left where it fails."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        if os.write(fd, data) != len(data):
            raise OSError(errno.EIO, "short write")
        os.fsync(fd)
    except OSError:
        path.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def is_hex(text: str) -> bool:
    """True for lowercase hexadecimal digits only (a run id; an empty string is not one)."""
    return bool(text) and all(c in "0123456789abcdef" for c in text)


def signing_context(*parts: str | int) -> bytes:
    """What a signature binds a file to besides its bytes (its kind, run, partition, round), encoded unambiguously."""
    return json.dumps(list(parts), separators=(",", ":")).encode()


def _signer(key: bytes, context: bytes) -> hmac.HMAC:
    """The HMAC-SHA256 a file's signature is: under `key`, `context` (length-prefixed) first, then the file's bytes."""
    digest = hmac.new(key, digestmod=hashlib.sha256)
    digest.update(len(context).to_bytes(8, "big"))
    digest.update(context)
    return digest


def _mac(fd: int, key: bytes, length: int, context: bytes) -> bytes:
    """HMAC-SHA256 (hex) of `context` (length-prefixed) and the first `length` bytes of the open file `fd`, read in
    chunks (a checkpoint may be gigabytes) with pread, so no file position moves."""
    digest = _signer(key, context)
    buffer = memoryview(bytearray(min(_CHUNK, max(length, 1))))
    done = 0
    while done < length:
        n = os.preadv(fd, [buffer[: min(len(buffer), length - done)]], done)
        if not n:
            raise EOFError(f"file ends at byte {done} of {length}")
        digest.update(buffer[:n])
        done += n
    return digest.hexdigest().encode()


def save_tree(path: Path, tree: Any, key: bytes | None = None, context: bytes = b"", durable: bool = True) -> int:
    """Pack `tree` into an .npz (uncompressed, as np.savez writes it) written atomically (see atomic_file) and
    streamed to disk, with no copy in memory; with `key`, signed together with `context` (its zip comment); returns
    its size."""
    with atomic_file(path, durable) as fh:
        with zipfile.ZipFile(fh, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
            if key is not None:
                archive.comment = SIGNATURE_PREFIX + bytes(SIGNATURE_HEX)  # written last; its bytes filled in below
            for name, array in pack(tree).items():
                with archive.open(f"{name}.npy", "w", force_zip64=True) as entry:
                    _write_npy(entry, array)
        size = fh.tell()
        if key is not None:
            fh.flush()
            os.pwrite(fh.fileno(), _mac(fh.fileno(), key, size - SIGNATURE_HEX, context), size - SIGNATURE_HEX)
    return size


def _mapped_member(fh: BinaryIO, archive: zipfile.ZipFile, name: str) -> np.ndarray | None:
    """A stored (uncompressed) .npy member of an .npz memory-mapped copy-on-write in place from the open file, or
    None when it cannot be (compressed, object dtype, sizes that do not add up)."""
    info = archive.getinfo(name)
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    fd = fh.fileno()  # pread: the zip reader's position in the shared file stays where it was
    local = os.pread(fd, 30, info.header_offset)
    if len(local) != 30 or local[:4] != b"PK\x03\x04":
        return None
    data_start = (
        info.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
    )
    header = io.BytesIO(os.pread(fd, _NPY_HEADER_MAX, data_start))
    try:
        version = np.lib.format.read_magic(header)
        readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in readers:
            return None
        shape, fortran, dtype = readers[version](header)
    except ValueError:
        return None
    offset = data_start + header.tell()
    if dtype.hasobject or offset - data_start + int(np.prod(shape)) * dtype.itemsize != info.file_size:
        return None
    # the open file, not its name: what is mapped is the file that was verified, even if the name was swapped since
    return np.memmap(fh, dtype=dtype, mode="c", offset=offset, shape=shape, order="F" if fortran else "C")


def _verified_copy(fh: BinaryIO, key: bytes, path: Path, context: bytes, in_memory: bool) -> BinaryIO:
    """The open file's bytes read once, into memory or (for a large file to be mapped) an unlinked private temporary
    file beside it, the signature checked on exactly those bytes: what is decoded afterwards is what was verified,
    even if the file is changed in place after the check (a check of the file and a later read or mapping of it let
    the same user change weights in between). StateFileError naming `path` when the copy is not signed by `key`."""
    size = os.fstat(fh.fileno()).st_size
    tail = len(SIGNATURE_PREFIX) + SIGNATURE_HEX
    copy: BinaryIO = io.BytesIO() if in_memory else tempfile.TemporaryFile(dir=Path(path).parent)
    digest = _signer(key, context)
    signed, done, last = size - SIGNATURE_HEX, 0, b""
    try:
        while done < size:
            chunk = os.pread(fh.fileno(), min(_CHUNK, size - done), done)
            if not chunk:
                break
            digest.update(chunk[: max(0, min(len(chunk), signed - done))])
            last = (last + chunk)[-tail:]
            copy.write(chunk)
            done += len(chunk)
    except OSError:
        copy.close()  # a failed read or a full disk: the private copy goes at once
        raise
    if done < tail or not last.startswith(SIGNATURE_PREFIX):
        copy.close()
        raise StateFileError(f"{path}: refused: it has no signature (damaged, or written by an older version)")
    if done != size or not hmac.compare_digest(last[-SIGNATURE_HEX:], digest.hexdigest().encode()):
        copy.close()
        raise StateFileError(
            f"{path}: refused: its signature does not match (the file was changed after it was written, was "
            "moved from another partition, round or run, or was signed with another key)"
        )
    copy.flush()
    copy.seek(0)
    return copy


def load_tree(path: Path, map_from_bytes: int | None = None, key: bytes | None = None, context: bytes = b"") -> Any:
    """Read a file written by `save_tree` (numpy arrays only: pickled objects are refused); with `key` the file is
    read once (see _verified_copy) and its signature (of `context` and the file) checked on those bytes before
    anything in them is decoded. Arrays of at least `map_from_bytes` are memory-mapped copy-on-write (from the
    verified private copy when signed) instead of read into memory."""
    try:
        with open(path, "rb") as original:
            fh = original if key is None else _verified_copy(original, key, Path(path), context, map_from_bytes is None)
            with fh, np.load(fh, allow_pickle=False) as npz:
                arrays = {}
                for name in npz.files:
                    info = npz.zip.getinfo(f"{name}.npy")
                    mapped = (
                        _mapped_member(fh, npz.zip, f"{name}.npy")
                        if map_from_bytes is not None and info.file_size >= map_from_bytes
                        else None
                    )
                    arrays[name] = mapped if mapped is not None else npz[name]
        return unpack(arrays)
    except StateFileError:
        raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:  # the private copy a signed file is checked and mapped from did not fit
            raise StateFileError(
                f"{path}: cannot be checked: no space left in {Path(path).parent} for its private copy (as large as "
                "the file); free that much and resume again"
            ) from None
        raise StateFileError(f"{path}: not a readable state file ({exc})") from None
    except (ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise StateFileError(f"{path}: not a readable state file ({exc})") from None
