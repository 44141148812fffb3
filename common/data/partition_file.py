"""`partition='file'`: every client's train and test indices read from an .npz file (arrays `train_0`, `test_0`,
`train_1`, `test_1`, ...: 1-D integer indices into the dataset in load order), validated with one-line errors;
`save_partition_file` writes one.

The file is the user's, so it is read defensively: its sizes are checked from the zip's directory and each array's
.npy header before anything is decompressed (a valid file holds at most one index per sample, so no more indices in
all than the data set has samples), and no index may repeat within a client or appear in two clients."""

from __future__ import annotations

import lzma
import math
import re
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from common.data.arrays import DataError

_NAME = re.compile(r"(train|test)_(0|[1-9][0-9]{0,8})")
_NPY_MAGIC = b"\x93NUMPY"
_NPY_HEADER_MAX = 4096  # bytes of one array's .npy header (np.savez writes 128)
_SHOWN_NAME_MAX = 40
# What reading a damaged or unusual zip member can raise (corrupt streams, encryption, unknown compression).
_READ_ERRORS = (
    OSError,
    ValueError,
    EOFError,
    RuntimeError,
    NotImplementedError,
    zipfile.BadZipFile,
    zlib.error,
    lzma.LZMAError,
)


def save_partition_file(path: str | Path, train: Sequence[np.ndarray], test: Sequence[np.ndarray]) -> None:
    """Write clients' train/test indices as `train_<k>`, `test_<k>` int64 arrays to exactly `path`."""
    if len(train) != len(test):
        raise ValueError(f"{len(train)} train and {len(test)} test index arrays: one of each per client")
    arrays = {}
    for k, (tr, te) in enumerate(zip(train, test)):
        arrays[f"train_{k}"] = np.asarray(tr, dtype=np.int64).reshape(-1)
        arrays[f"test_{k}"] = np.asarray(te, dtype=np.int64).reshape(-1)
    with Path(path).expanduser().open("wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _shown(name: str) -> str:
    """A member name quoted for a one-line message: escaped, and cut when long."""
    if len(name) <= _SHOWN_NAME_MAX:
        return ascii(name)
    return f"{ascii(name[:_SHOWN_NAME_MAX])}... ({len(name)} characters)"


def _members(where: str, infos: Sequence[zipfile.ZipInfo]) -> dict[str, zipfile.ZipInfo]:
    """Array name (`train_<k>`, `test_<k>`) -> its zip member; any other, or a repeated, member is refused."""
    members: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        name = info.filename.removesuffix(".npy")
        if name == info.filename:
            raise DataError(f"{where}: unexpected member {_shown(name)}; arrays are stored as <name>.npy")
        if _NAME.fullmatch(name) is None:
            raise DataError(
                f"{where}: unexpected array {_shown(name)}; the file holds only train_<k> and test_<k> arrays"
            )
        if name in members:
            raise DataError(f"{where}: array '{name}' is stored twice")
        members[name] = info
    return members


def _client_count(where: str, names: Sequence[str]) -> int:
    clients: dict[int, set[str]] = {}
    for name in names:
        match = _NAME.fullmatch(name)
        assert match is not None, name  # _members admits only these names
        clients.setdefault(int(match.group(2)), set()).add(match.group(1))
    if not clients:
        raise DataError(f"{where}: holds no train_<k>/test_<k> arrays")
    for k in range(max(clients) + 1):
        for side in ("train", "test"):
            if side not in clients.get(k, set()):
                raise DataError(
                    f"{where}: client {k} has no '{side}_{k}' array (clients are numbered 0..{max(clients)})"
                )
    return len(clients)


def _check_sizes(where: str, members: dict[str, zipfile.ZipInfo], num_samples: int) -> None:
    """Refuse, from the zip's directory alone, arrays that would unpack to more than the indices a file can hold:
    the train arrays together one index per sample of the data set, each test array as many (clients may share
    test samples, never training ones)."""
    trains = [info.file_size for name, info in members.items() if name.startswith("train_")]
    declared, bound = sum(trains), len(trains) * _NPY_HEADER_MAX + 8 * num_samples
    if declared > bound:
        raise DataError(
            f"{where}: its train arrays unpack to {declared} bytes, more than the {bound} that {num_samples} indices "
            "(one per sample of the data set) and their headers take: refusing to decompress it"
        )
    for name, info in members.items():
        if name.startswith("test_") and info.file_size > _NPY_HEADER_MAX + 8 * num_samples:
            raise DataError(
                f"{where}: '{name}' unpacks to {info.file_size} bytes, more than {num_samples} indices take: "
                "refusing to decompress it"
            )


@dataclass(frozen=True)
class _Header:
    """What an array's .npy header declares."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def size(self) -> int:
        """Elements declared."""
        return math.prod(self.shape)


def _read_header(fh: IO[bytes]) -> _Header:
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(fh, max_header_size=_NPY_HEADER_MAX)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(fh, max_header_size=_NPY_HEADER_MAX)
    else:
        raise ValueError(f".npy format version {version[0]}.{version[1]} (expected 1.0 or 2.0)")
    return _Header(tuple(shape), dtype)


def _check_header(where: str, name: str, header: _Header) -> None:
    if len(header.shape) != 1:
        raise DataError(f"{where}: '{name}' has shape {header.shape}; indices must be a 1-D array")
    if header.dtype.kind not in "iu":
        raise DataError(f"{where}: '{name}' has dtype {header.dtype}; indices must be integers")
    if header.size < 0:  # a negative count would read the member to its end
        raise DataError(f"{where}: '{name}' has shape {header.shape}; not a valid .npy header")
    if header.size == 0:
        raise DataError(f"{where}: '{name}' is empty; every client needs training and test samples")


def _read_array(where: str, name: str, fh: IO[bytes], header: _Header) -> np.ndarray:
    nbytes = header.size * header.dtype.itemsize
    data = fh.read(nbytes + 1)  # one byte more: trailing bytes are refused, and reading to the end checks the CRC
    if len(data) != nbytes:
        raise DataError(
            f"{where}: '{name}' holds {len(data)} bytes of data, its header declares {header.size} "
            f"{header.dtype} values ({nbytes} bytes)"
        )
    return np.frombuffer(data, dtype=header.dtype)


def _indices(where: str, name: str, values: np.ndarray, num_samples: int) -> np.ndarray:
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= num_samples:
        bad = low if low < 0 else high
        raise DataError(
            f"{where}: '{name}' holds index {bad}, outside 0..{num_samples - 1} (the dataset's "
            f"{num_samples} samples in load order)"
        )
    ordered = np.sort(values)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    if repeated.size:
        raise DataError(f"{where}: '{name}' repeats index {int(repeated[0])}; a client holds each of its samples once")
    return values.astype(np.int64)


def _load_arrays(
    where: str, archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], num_samples: int
) -> dict[str, np.ndarray]:
    """Every array, each header checked before its data is decompressed; at most `num_samples` training indices
    in all, and as many in each test array."""
    arrays: dict[str, np.ndarray] = {}
    trained = 0
    for name in sorted(members, key=lambda n: (int(n.rpartition("_")[2]), n.startswith("test"))):
        try:
            with archive.open(members[name]) as fh:
                header = _read_header(fh)
                _check_header(where, name, header)
                if name.startswith("train_"):
                    trained += header.size
                if trained > num_samples:
                    raise DataError(
                        f"{where}: its arrays declare more than {num_samples} indices (at '{name}'), more than "
                        "the data set has samples: a sample trains at most one client"
                    )
                if header.size > num_samples:
                    raise DataError(
                        f"{where}: '{name}' declares {header.size} indices, more than the {num_samples} samples of "
                        "the data set"
                    )
                values = _read_array(where, name, fh, header)
        except DataError:
            raise
        except _READ_ERRORS as exc:
            raise DataError(f"{where}: array '{name}' is unreadable ({_first_line(exc)})") from exc
        arrays[name] = _indices(where, name, values, num_samples)
    return arrays


def _check_disjoint(where: str, train: Sequence[np.ndarray], test: Sequence[np.ndarray], num_samples: int) -> None:
    """A sample trains at most one client and then tests none; clients may share test samples (grouped splits, as
    FedAMP's and PFLlib's, draw each client's test set from one pool)."""
    for k, (tr, te) in enumerate(zip(train, test)):
        shared = np.intersect1d(tr, te)
        if shared.size:
            raise DataError(
                f"{where}: client {k}'s train and test share {shared.size} indices (e.g. "
                f"{int(shared[0])}); a client must not test on its training samples"
            )
    owner = np.full(num_samples, -1, dtype=np.int64)  # the client that trains on each sample
    for k, tr in enumerate(train):
        if (first := _first_owned(owner, tr)) is not None:
            raise DataError(
                f"{where}: clients {int(owner[first])} and {k} both train on index {first}; a sample trains at "
                "most one client"
            )
        owner[tr] = k
    for k, te in enumerate(test):
        if (first := _first_owned(owner, te)) is not None:
            raise DataError(
                f"{where}: client {k} tests on index {first}, which client {int(owner[first])} trains on; a test "
                "sample must be one no client trains on"
            )


def _first_owned(owner: np.ndarray, indices: np.ndarray) -> int | None:
    """The first of `indices` some client already trains on (None: none is)."""
    owned = np.flatnonzero(owner[indices] >= 0)
    return int(indices[owned[0]]) if owned.size else None


def _open_zip(where: str, file: Path) -> zipfile.ZipFile:
    try:
        with file.open("rb") as fh:
            if fh.read(len(_NPY_MAGIC)) == _NPY_MAGIC:
                raise DataError(f"{where}: a single .npy array, not an .npz archive of train_<k>/test_<k> arrays")
        return zipfile.ZipFile(file)
    except DataError:
        raise
    except _READ_ERRORS as exc:
        raise DataError(f"{where}: not a readable .npz archive ({_first_line(exc)})") from exc


def read_partition_file(
    path: str | Path, num_clients: int, num_samples: int
) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The first `num_clients` clients' (train, test) indices of the file, every client in it validated; a DataError
    naming the file and what is wrong."""
    file = Path(path).expanduser()
    where = f"partition-file {file}"
    if not file.is_file():
        raise DataError(f"{where}: no such file")
    with _open_zip(where, file) as archive:
        members = _members(where, archive.infolist())
        count = _client_count(where, list(members))
        if num_clients > count:
            raise DataError(
                f"{where}: holds {count} clients, the run has {num_clients}: use at most {count} (num-supernodes)"
            )
        _check_sizes(where, members, num_samples)
        arrays = _load_arrays(where, archive, members, num_samples)
    train = [arrays[f"train_{k}"] for k in range(count)]
    test = [arrays[f"test_{k}"] for k in range(count)]
    _check_disjoint(where, train, test, num_samples)
    return tuple(train[:num_clients]), tuple(test[:num_clients])
