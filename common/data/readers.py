"""FEMNIST (LEAF, by writer; all 62 classes or its digits only), UCI HAR (inertial signals, by subject) and USPS
read from the data folder into DatasetArrays; samples keep their files' order (the order `partition='file'` indices
refer to). CIFAR-10's python batches are decoded here from bytes already checked, by an unpickler that admits
nothing but numpy arrays; MNIST's IDX files are read here too."""

from __future__ import annotations

import gzip
import io
import lzma
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
from numpy._core.multiarray import _reconstruct

from common.data.arrays import DataError, DatasetArrays
from common.data.domains import read_usps, usps_missing

FEMNIST_FILE = "FEMNIST_LEAF/femnist_leaf_niid_sf005.npz"
HAR_FILES = ("UCI_HAR/inertial_x_float32_N-128-9.npy.xz", "UCI_HAR/labels_subjects.npz")
# Per channel over the inverted images (FEMNIST), the official UCI training subjects' windows (HAR), the 7,291
# training images (USPS).
FEMNIST_NORM = ((0.0378,), (0.1627,))
HAR_NORM = (
    (-0.0006, -0.0003, -0.0003, 0.0005, -0.0008, 0.0001, 0.8047, 0.0288, 0.0865),
    (0.1948, 0.1224, 0.1069, 0.4068, 0.3819, 0.2557, 0.4141, 0.3910, 0.3578),
)
USPS_NORM = ((0.2539,), (0.3842,))


def _missing(dataset: str, data_dir: Path, files: tuple[str, ...]) -> None:
    absent = [f for f in files if not (data_dir / f).is_file()]
    if absent:
        raise DataError(
            f"{dataset}: expected {', '.join(str(data_dir / f) for f in absent)} (set run-config "
            "'data-dir' or $PFL_DATA_DIR to the folder holding it)"
        )


def files_missing(dataset: str, data_dir: Path) -> DataError | None:
    """The error a reader of femnist, femnist-digits, har or usps raises first when its files are not in data_dir
    (None: they are, or the data set is none of these)."""
    if dataset == "usps":
        return usps_missing(data_dir, dataset)
    files = {"femnist": (FEMNIST_FILE,), "femnist-digits": (FEMNIST_FILE,), "har": HAR_FILES}.get(dataset)
    try:
        if files is not None:
            _missing(dataset, data_dir, files)
    except DataError as exc:
        return exc
    return None


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An IDX file of unsigned bytes with `ndim` dimensions (MNIST's and Fashion-MNIST's format), plain or gzipped
    (by its `.gz` name), its magic number and sizes checked: the array torchvision's MNIST reads from the same file.
    Read here, not through torchvision, because a deployment starts a process per message and importing torchvision
    costs ~4 CPU-seconds of each on x86 (far more on a Raspberry Pi)."""
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as file:
            data = file.read()
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot be read: {exc}") from exc
    header = 4 + 4 * ndim
    if len(data) < header or data[:4] != bytes((0, 0, 0x08, ndim)):
        raise DataError(f"{path}: not an IDX file of unsigned bytes with {ndim} dimension(s)")
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    if len(data) - header != math.prod(shape):
        raise DataError(f"{path}: {len(data) - header} bytes of data for the declared shape {shape}")
    return np.frombuffer(data, np.uint8, offset=header).reshape(shape)


def _npz(dataset: str, path: Path, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {k: archive[k] for k in keys}
    except (OSError, ValueError, KeyError, EOFError) as exc:
        raise DataError(f"{dataset}: could not read {path} (arrays {', '.join(keys)}): {exc}") from exc


def _femnist_file(dataset: str, data_dir: Path) -> dict[str, np.ndarray]:
    """The staged FEMNIST file's images (inverted: ink high, (N, 1, 28, 28) uint8), labels and writers."""
    _missing(dataset, data_dir, (FEMNIST_FILE,))
    arrays = _npz(dataset, data_dir / FEMNIST_FILE, ("x", "y", "writer"))
    return {
        "x": np.ascontiguousarray((255 - arrays["x"].astype(np.uint8))[:, None, :, :]),
        "y": arrays["y"].astype(np.int64),
        "writer": arrays["writer"].astype(np.int64),
    }


def _femnist_arrays(name: str, arrays: dict[str, np.ndarray], num_classes: int) -> DatasetArrays:
    mean, std = FEMNIST_NORM
    return DatasetArrays(
        name,
        arrays["x"],
        arrays["y"],
        num_classes,
        mean,
        std,
        255.0,
        natural_id=arrays["writer"],
        natural_kind="writer",
    )


def femnist(data_dir: Path) -> DatasetArrays:
    """LEAF's FEMNIST sample: (N, 1, 28, 28) uint8 with ink high (LEAF stores white backgrounds), 62 classes,
    the writer of every sample as its natural id; rows in the file's order (by writer)."""
    return _femnist_arrays("femnist", _femnist_file("femnist", data_dir), 62)


def femnist_digits(data_dir: Path) -> DatasetArrays:
    """FEMNIST's digits only: the file's samples with labels 0-9 (10 classes), as `femnist` reads them (same
    images, normalization and writers), in the file's order."""
    arrays = _femnist_file("femnist-digits", data_dir)
    digits = arrays["y"] < 10
    return _femnist_arrays("femnist-digits", {key: a[digits] for key, a in arrays.items()}, 10)


def har(data_dir: Path) -> DatasetArrays:
    """UCI HAR's inertial windows: (N, 9, 128) float32 (channels, then 128 steps at 50 Hz), 6 activities, the
    subject (1-30) of every window as its natural id; rows in the files' order (by subject)."""
    _missing("har", data_dir, HAR_FILES)
    path = data_dir / HAR_FILES[0]
    try:
        with lzma.open(path) as fh:
            x = np.load(fh, allow_pickle=False)
    except (OSError, ValueError, EOFError, lzma.LZMAError) as exc:
        raise DataError(f"har: could not read {path}: {exc}") from exc
    labels = _npz("har", data_dir / HAR_FILES[1], ("y", "subject"))
    if x.ndim != 3 or x.shape[1:] != (128, 9) or len(x) != len(labels["y"]) or len(x) != len(labels["subject"]):
        raise DataError(
            f"har: {path} holds {x.shape}, expected (N, 128, 9) with N the length of 'y' and 'subject' "
            f"in {data_dir / HAR_FILES[1]}"
        )
    mean, std = HAR_NORM
    return DatasetArrays(
        "har",
        np.ascontiguousarray(x.astype(np.float32).transpose(0, 2, 1)),
        labels["y"].astype(np.int64),
        6,
        mean,
        std,
        1.0,
        natural_id=labels["subject"].astype(np.int64),
        natural_kind="subject",
    )


def usps(data_dir: Path) -> DatasetArrays:
    """USPS: (9298, 1, 16, 16) uint8, the 7,291 training images then the 2,007 test images, 10 classes."""
    x, y = read_usps(data_dir, "usps")
    mean, std = USPS_NORM
    return DatasetArrays("usps", np.ascontiguousarray(x[:, None, :, :]), y, 10, mean, std, 255.0)


# The only globals a CIFAR-10 python batch refers to (numpy's array reconstruction; numpy 1 pickles, the official
# files among them, name the module numpy.core). Everything else, builtins included, is refused.
_CIFAR_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}
CIFAR_PIXELS = 3 * 32 * 32


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles one CIFAR-10 batch held in memory; a reference to any other global is refused."""

    def __init__(self, data: bytes, path: Path) -> None:
        super().__init__(io.BytesIO(data), encoding="bytes")
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        """The allowed numpy global, or a DataError naming the file and the global it asked for."""
        found = _CIFAR_GLOBALS.get((module, name))
        if found is None:
            raise DataError(
                f"cifar10: {self._path} refers to {ascii(f'{module}.{name}')[:80]}, which no CIFAR-10 batch "
                "needs: refusing to unpickle it"
            )
        return found


def decode_cifar_batch(path: Path, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """A CIFAR-10 python batch's bytes -> images (N, 3, 32, 32) uint8 and labels (N,) int64; anything else in
    the pickle is a one-line DataError naming `path`."""
    try:
        batch = _CifarUnpickler(data, path).load()
    except DataError:
        raise
    except Exception as exc:  # a damaged pickle fails in many ways (EOF, types, recursion): each is one line
        raise DataError(f"cifar10: {path} could not be decoded ({_first_line(exc)})") from exc
    return _cifar_arrays(path, batch)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _cifar_arrays(path: Path, batch: object) -> tuple[np.ndarray, np.ndarray]:
    images = batch.get(b"data") if isinstance(batch, dict) else None
    labels = batch.get(b"labels") if isinstance(batch, dict) else None
    if (
        not isinstance(images, np.ndarray)
        or images.dtype != np.uint8
        or images.ndim != 2
        or images.shape[1] != CIFAR_PIXELS
        or not isinstance(labels, list)
        or len(labels) != len(images)
        or not all(type(label) is int and 0 <= label < 10 for label in labels)
    ):
        raise DataError(
            f"cifar10: {path} is not a CIFAR-10 batch (a dict with b'data', uint8 (N, {CIFAR_PIXELS}), and "
            "b'labels', N ints in 0..9)"
        )
    return images.reshape(-1, 3, 32, 32), np.asarray(labels, dtype=np.int64)
