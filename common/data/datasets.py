"""Datasets as in-memory numpy arrays: torchvision formats and the staged FEMNIST, HAR and USPS files from a local
folder, or the embedded default."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path

import numpy as np

from common.data.arrays import DataError, DatasetArrays
from common.data.domains import digit_domains, digit_domains_cached, usps_missing
from common.data.readers import decode_cifar_batch, femnist, femnist_digits, files_missing, har, read_idx, usps

_MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
_TORCHVISION_NAMES = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
_NORMALIZATION = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "digits": ((0.3,), (0.38,)),
}


def _digits() -> DatasetArrays:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = bunch.images.astype(np.uint8)[:, None, :, :]  # (1797, 1, 8, 8), values 0..16
    mean, std = _NORMALIZATION["digits"]
    return DatasetArrays("digits", x, bunch.target.astype(np.int64), 10, mean, std, 16.0)


def _idx_file(raw: Path, name: str) -> Path | None:
    """One of the MNIST-like files in `raw`, extracted or as its `.gz`; None when neither is there."""
    return next((p for p in (raw / name.removesuffix(".gz"), raw / name) if p.is_file()), None)


def _mnist_files(name: str, data_dir: Path, cache_dir: Path) -> list[Path] | None:
    """The four MNIST-like files (extracted or .gz, in _MNIST_FILES' order): data_dir's, else the cache's (where a
    download goes); None when neither folder holds all four."""
    folder = _TORCHVISION_NAMES[name]
    for raw in (data_dir / folder / "raw", cache_dir / folder / "raw"):
        found = [_idx_file(raw, f) for f in _MNIST_FILES]
        if all(found):
            return [p for p in found if p is not None]
    return None


def _mnist_missing(name: str, data_dir: Path, cache_dir: Path) -> DataError | None:
    """The error for MNIST-like files that are neither in data_dir (extracted or .gz) nor in the cache."""
    if _mnist_files(name, data_dir, cache_dir) is not None:
        return None
    folder = _TORCHVISION_NAMES[name]
    return DataError(
        f"{name}: expected {', '.join(_MNIST_FILES)} in {data_dir / folder / 'raw'} (set run-config 'data-dir' or "
        f"$PFL_DATA_DIR to the folder holding '{folder}/raw', or allow-download=true)"
    )


def _download_mnist(name: str, cache_dir: Path) -> None:
    """torchvision's download of an MNIST-like dataset into the cache (its checksums checked by torchvision)."""
    from torchvision import datasets

    cls = getattr(datasets, _TORCHVISION_NAMES[name])
    try:
        for train in (True, False):
            cls(str(cache_dir), train=train, download=True)
    except (RuntimeError, OSError) as exc:
        raise DataError(f"{name}: could not download into {cache_dir}: {exc}") from exc


def _mnist_like(name: str, data_dir: Path, cache_dir: Path, allow_download: bool) -> DatasetArrays:
    files = _mnist_files(name, data_dir, cache_dir)
    if files is None:
        if not allow_download:
            raise _mnist_missing(name, data_dir, cache_dir) or DataError(f"{name}: files missing")
        _download_mnist(name, cache_dir)
        files = _mnist_files(name, data_dir, cache_dir)
        if files is None:
            raise DataError(f"{name}: the download left no {', '.join(_MNIST_FILES)} in {cache_dir}")
    raw = files[0].parent
    train_x, train_y, test_x, test_y = (read_idx(p, ndim) for p, ndim in zip(files, (3, 1, 3, 1), strict=True))
    if len(train_x) != len(train_y) or len(test_x) != len(test_y):
        raise DataError(f"{name}: images and labels in {raw} differ in number")
    x = np.concatenate([train_x, test_x])[:, None, :, :]
    y = np.concatenate([train_y, test_y]).astype(np.int64)
    if y.size and y.max() >= 10:
        raise DataError(f"{name}: a label in {raw} is {y.max()}, not one of the 10 classes")
    mean, std = _NORMALIZATION[name]
    return DatasetArrays(name, x, y, 10, mean, std, 255.0)


# CIFAR-10 arrives as pickles, and unpickling runs code: every file is read once, its bytes are checked, and those
# same bytes are decoded by an unpickler that admits only numpy arrays (readers.decode_cifar_batch). Accepted: the
# official files (torchvision's md5 list, computed here) and the staged rebuild of all five training batches (sha256
# from its manifest: 124 of the 60,000 images are JPEG approximations, so no official md5 matches).
CIFAR_OFFICIAL_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
    "batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
}
CIFAR_SUBSET_SHA256 = {
    "batches.meta": "f962466ef690d46b226450fb9aadc74ba4bc64a76aa526b5827fe4bc5c7125cb",
    "data_batch_1": "b4f4c8724d55deffc76c36261a4ae62699985e39f7c419fecf24b8038cee34f0",
    "data_batch_2": "4b85fbb4b4c0a2ebc212aced2e75ec10cd540a0d37a1fae3dd65636074453008",
    "data_batch_3": "08b2602136b8d3a35b2702051648fb2edbc1a635b9c6d4da6881814cc9bc0fab",
    "data_batch_4": "e5a357063686fec0c6a7f722f4da2d82e06967f53b954b44d8e95744b26d4105",
    "data_batch_5": "b9fa7499f6dca4553b24122a86341c786a51690b370320ccd2b30177c25ac795",
    "test_batch": "27eb6e7e6a92c9dc24675b918bfe208b09e342e5e8a2e4d279509416399ff788",
}


CIFAR_MAX_FILE_BYTES = 64 << 20  # an official batch is 31,035,704 bytes


def verify_cifar_file(path: Path) -> bytes:
    """The bytes of a CIFAR-10 pickle, read once; a DataError unless they are an official file's or the subset's."""
    try:
        with path.open("rb") as handle:
            data = handle.read(CIFAR_MAX_FILE_BYTES + 1)  # a batch is 31 MB: a huge file is refused unread
    except OSError as exc:
        raise DataError(f"cifar10: could not read {path}: {exc.strerror or exc}") from exc
    if len(data) > CIFAR_MAX_FILE_BYTES:
        raise DataError(f"cifar10: {path} is larger than any CIFAR-10 file ({CIFAR_MAX_FILE_BYTES:,} bytes): refused")
    md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
    sha256 = hashlib.sha256(data).hexdigest()
    if md5 != CIFAR_OFFICIAL_MD5.get(path.name) and sha256 != CIFAR_SUBSET_SHA256.get(path.name):
        raise DataError(
            f"cifar10: {path} is neither the official CIFAR-10 file nor the known subset's "
            f"(sha256 {sha256}): refusing to unpickle it"
        )
    return data


def _download_cifar10(data_dir: Path) -> None:
    from torchvision import datasets
    from torchvision.datasets.utils import download_and_extract_archive

    # Only the archive (md5-checked by torchvision); its batches are then read like local ones, never by torchvision.
    cls = datasets.CIFAR10
    try:
        download_and_extract_archive(cls.url, str(data_dir), filename=cls.filename, md5=cls.tgz_md5)
    except (OSError, RuntimeError) as exc:
        raise DataError(f"cifar10: could not download {cls.url} into {data_dir}: {exc}") from exc


def _cifar_missing(data_dir: Path) -> DataError | None:
    """The error for a data folder without CIFAR-10's batches (at least one data_batch_* and test_batch)."""
    folder = data_dir / "cifar-10-batches-py"
    batches = list(folder.glob("data_batch_*")) if folder.is_dir() else []
    if batches and (folder / "test_batch").exists():
        return None
    return DataError(
        f"cifar10: expected data_batch_1..5 and test_batch in {folder} (set run-config "
        "'data-dir' or $PFL_DATA_DIR, or allow-download=true)"
    )


def _cifar10(data_dir: Path, allow_download: bool) -> DatasetArrays:
    folder = data_dir / "cifar-10-batches-py"
    batches = sorted(p.name for p in folder.glob("data_batch_*")) if folder.is_dir() else []
    if not batches or not (folder / "test_batch").exists():
        if not allow_download and (missing := _cifar_missing(data_dir)):
            raise missing
        _download_cifar10(data_dir)
        batches = sorted(p.name for p in folder.glob("data_batch_*"))
    # Each file is decoded from the very bytes that were checked (a file swapped after the check is never read).
    parts = [decode_cifar_batch(folder / name, verify_cifar_file(folder / name)) for name in [*batches, "test_batch"]]
    x = np.concatenate([images for images, _ in parts])
    y = np.concatenate([labels for _, labels in parts])
    mean, std = _NORMALIZATION["cifar10"]
    return DatasetArrays("cifar10", np.ascontiguousarray(x), y, 10, mean, std, 255.0)


DataSource = Callable[[str], DatasetArrays]  # a data set's name -> its arrays, served instead of the files
_SOURCE: DataSource | None = None


def use_data_source(source: DataSource | None) -> None:
    """Serve every data set this process loads from `source` (e.g. an export of the rows a sweep reads) instead of
    the files under the data dir; None: the files again."""
    global _SOURCE
    _SOURCE = source


def load_dataset(name: str, data_dir: str, allow_download: bool = False) -> DatasetArrays:
    """Load a whole dataset (train and test pooled): from the data source this process serves, if any, else from
    its files, cached per process."""
    if _SOURCE is not None:
        return _SOURCE(name)
    return _load_files(name, data_dir, allow_download)


def clear_dataset_cache() -> None:
    """Forget the data sets loaded from files (their files changed, e.g. in a test)."""
    _load_files.cache_clear()


def _cache_dir() -> Path:
    return Path(os.environ.get("PFL_CACHE_DIR", Path.home() / ".cache" / "pflower")).expanduser() / "extracted"


@lru_cache(maxsize=2)
def _load_files(name: str, data_dir: str, allow_download: bool = False) -> DatasetArrays:
    spec = DATASET_SPECS.get(name)
    if spec is None:
        raise DataError(f"unknown dataset '{name}'")
    return spec.load(Path(data_dir).expanduser(), _cache_dir(), allow_download)


def check_dataset_files(name: str, data_dir: str, allow_download: bool = False) -> None:
    """A one-line DataError when the data set's files are not under data_dir (the loaders' own checks, without
    reading the data): what a run would find only after it started. A download, if allowed, is not checked; an
    unknown name is the run config's error."""
    spec = DATASET_SPECS.get(name)
    missing = spec.missing(Path(data_dir).expanduser(), _cache_dir(), allow_download) if spec else None
    if missing is not None:
        raise missing


@dataclass(frozen=True)
class DatasetSpec:
    """One data set of the registry: its name, a line for the docs, the model `model=auto` picks for it, how it
    loads and what files it needs (checked before a run starts, without reading them)."""

    name: str
    about: str
    default_model: str
    load: Callable[[Path, Path, bool], DatasetArrays]  # (data dir, cache dir, allow download) -> the whole data set
    missing: Callable[[Path, Path, bool], DataError | None]  # the same arguments -> what is missing (None: nothing)


def _embedded(data_dir: Path, cache_dir: Path, allow_download: bool) -> None:
    return None


def _mnist_check(name: str, data_dir: Path, cache_dir: Path, allow_download: bool) -> DataError | None:
    return None if allow_download else _mnist_missing(name, data_dir, cache_dir)


def _digit_domains_missing(data_dir: Path, cache_dir: Path, allow_download: bool) -> DataError | None:
    if digit_domains_cached(cache_dir):
        return None
    for part in ("mnist", "cifar10"):  # built from these (never downloaded for it) and USPS
        if (missing := DATASET_SPECS[part].missing(data_dir, cache_dir, False)) is not None:
            return missing
    return usps_missing(data_dir, "digit-domains")


def _read_files(read: Callable[[Path], DatasetArrays]) -> Callable[[Path, Path, bool], DatasetArrays]:
    """The loader of a data set read from its staged files (readers.py)."""
    return lambda data_dir, _cache, _download: read(data_dir)


def _staged(name: str) -> Callable[[Path, Path, bool], DataError | None]:
    """The check of a data set read from its staged files."""
    return lambda data_dir, _cache, _download: files_missing(name, data_dir)


DATASET_SPECS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "digits", "scikit-learn's 8x8 digits, embedded: no download", "mlp", lambda *_: _digits(), _embedded
        ),
        DatasetSpec(
            "mnist", "MNIST (`MNIST/raw`)", "cnn-mnist", partial(_mnist_like, "mnist"), partial(_mnist_check, "mnist")
        ),
        DatasetSpec(
            "fashion-mnist",
            "Fashion-MNIST (`FashionMNIST/raw`)",
            "cnn-mnist",
            partial(_mnist_like, "fashion-mnist"),
            partial(_mnist_check, "fashion-mnist"),
        ),
        DatasetSpec(
            "cifar10",
            "CIFAR-10: every `data_batch_*` present in `cifar-10-batches-py` (all 50,000 training images with the "
            "test batch's 10,000 pooled)",
            "cnn-cifar",
            lambda data_dir, _c, download: _cifar10(data_dir, download),
            lambda data_dir, _c, download: None if download else _cifar_missing(data_dir),
        ),
        DatasetSpec(
            "digit-domains",
            "MNIST, USPS, MNIST-M-style and SYN-style digits at 32x32 RGB, built from `data-dir` (MNIST, USPS, "
            "CIFAR-10)",
            "resnet10-s",
            lambda data_dir, cache, _d: digit_domains(data_dir, cache, lambda part: _load_files(part, str(data_dir))),
            _digit_domains_missing,
        ),
        DatasetSpec(
            "femnist",
            "LEAF's FEMNIST sample, 28x28, 62 classes, by writer",
            "cnn-mnist",
            _read_files(femnist),
            _staged("femnist"),
        ),
        DatasetSpec(
            "femnist-digits",
            "FEMNIST's digit samples only (the same file): 10 classes, by writer",
            "cnn-mnist",
            _read_files(femnist_digits),
            _staged("femnist-digits"),
        ),
        DatasetSpec(
            "har",
            "UCI HAR's inertial windows, 9 channels x 128 steps, 6 activities, by subject",
            "dnn-har",
            _read_files(har),
            _staged("har"),
        ),
        DatasetSpec(
            "usps", "16x16 digits, its train and test files pooled", "cnn-mnist", _read_files(usps), _staged("usps")
        ),
    )
}


def normalize(data: DatasetArrays, x: np.ndarray) -> np.ndarray:
    """Samples (uint8 images or float32 signals, channels on axis 1) -> float32 normalized per channel."""
    out = x.astype(np.float32) / data.scale
    mean = np.asarray(data.mean, dtype=np.float32).reshape(1, -1, *([1] * (x.ndim - 2)))
    std = np.asarray(data.std, dtype=np.float32).reshape(1, -1, *([1] * (x.ndim - 2)))
    return (out - mean) / std
