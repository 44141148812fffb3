"""`partition='file'`: every client's train and test indices read from an .npz file (arrays `train_0`, `test_0`,
`train_1`, `test_1`, ...: 1-D integer indices into the dataset in load order), validated with one-line errors;
`save_partition_file` writes one."""

from __future__ import annotations

import re
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .arrays import DataError

_NAME = re.compile(r"(train|test)_(0|[1-9][0-9]*)")


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
    return text.splitlines()[0] if text else type(exc).__name__


def _client_count(where: str, names: Sequence[str]) -> int:
    clients: dict[int, set[str]] = {}
    for name in names:
        match = _NAME.fullmatch(name)
        if match is None:
            raise DataError(f"{where}: unexpected array '{name}'; the file holds only train_<k> and test_<k> arrays")
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


def _indices(where: str, name: str, values: np.ndarray, num_samples: int) -> np.ndarray:
    if values.ndim != 1:
        raise DataError(f"{where}: '{name}' has shape {values.shape}; indices must be a 1-D array")
    if values.dtype.kind not in "iu":
        raise DataError(f"{where}: '{name}' has dtype {values.dtype}; indices must be integers")
    if values.size == 0:
        raise DataError(f"{where}: '{name}' is empty; every client needs training and test samples")
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= num_samples:
        bad = low if low < 0 else high
        raise DataError(
            f"{where}: '{name}' holds index {bad}, outside 0..{num_samples - 1} (the dataset's "
            f"{num_samples} samples in load order)"
        )
    return values.astype(np.int64)


def read_partition_file(
    path: str | Path, num_clients: int, num_samples: int
) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The first `num_clients` clients' (train, test) indices of the file, every client in it validated; a DataError
    naming the file and what is wrong."""
    file = Path(path).expanduser()
    where = f"partition-file {file}"
    if not file.is_file():
        raise DataError(f"{where}: no such file")
    try:
        archive = np.load(file, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{where}: not a readable .npz archive ({_first_line(exc)})") from exc
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataError(f"{where}: a single .npy array, not an .npz archive of train_<k>/test_<k> arrays")
    train, test = [], []
    with archive:
        count = _client_count(where, archive.files)
        if num_clients > count:
            raise DataError(
                f"{where}: holds {count} clients, the run has {num_clients}: use at most {count} (num-supernodes)"
            )
        for k in range(count):
            try:
                tr, te = archive[f"train_{k}"], archive[f"test_{k}"]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
                raise DataError(f"{where}: client {k}'s arrays are unreadable ({_first_line(exc)})") from exc
            tr = _indices(where, f"train_{k}", tr, num_samples)
            te = _indices(where, f"test_{k}", te, num_samples)
            shared = np.intersect1d(tr, te)
            if shared.size:
                raise DataError(
                    f"{where}: client {k}'s train and test share {shared.size} indices (e.g. "
                    f"{int(shared[0])}); a client must not test on its training samples"
                )
            train.append(tr)
            test.append(te)
    return tuple(train[:num_clients]), tuple(test[:num_clients])
