"""A data export: the samples a set of runs reads (their clients' train, test and shift-draw rows, the domains' test
rows) and every label, in one file, for a machine without the data sets (a rented GPU); served in place of the data
set there, the runs see the very same partitions and tensors. Images may be stored as lossless WebP (about 0.6 of
their bytes on CIFAR-10), which PIL decodes back bit for bit.

    pflower export bench/sweeps/results.toml --experiments cifar-dmpfl --set num-rounds=300 --out cifar.npz
    python -m experiments.engine --data-export cifar.npz --run-config '...' --clients 100   # there
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from common.data.arrays import DataError, DatasetArrays
from common.data.datasets import use_data_source
from common.data.settings import DataSettings

ENV = "PFLOWER_DATA_EXPORT"  # the engine's processes serve the data set from this file when it is set


def rows_read(data: DataSettings, clients: int) -> set[int]:
    """The data set rows a run reads: its clients' train, test and shift-draw rows, and the domains' test rows."""
    from common.data.federated import federated_split
    from common.data.shift import make_shift_plan
    from common.seeding import derive_seed

    split = federated_split(data, clients)
    rows: set[int] = set()
    for pid in range(clients):
        rows.update(split.train[pid].tolist())
        rows.update(split.test[pid].tolist())
        rows.update(make_shift_plan(split.test[pid], split.pool, derive_seed(data.seed, "shift", pid)).draws.tolist())
    for held_out in split.domain_test:
        rows.update(held_out.tolist())
    return rows


def _webp(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images (N, C, H, W) with 1 or 3 channels as lossless WebP: (all bytes, end offset of each image)."""
    from PIL import Image

    blobs, ends, total = [], [], 0
    for image in images:
        picture = Image.fromarray(image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0))
        buffer = io.BytesIO()
        picture.save(buffer, format="WEBP", lossless=True, quality=100, method=4, exact=True)
        blobs.append(buffer.getvalue())
        total += len(blobs[-1])
        ends.append(total)
    return np.frombuffer(b"".join(blobs), dtype=np.uint8), np.asarray(ends, dtype=np.int64)


def _unwebp(data: np.ndarray, ends: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The images `_webp` stored, uint8 (N, C, H, W). Each is opened as WebP only and its size read from its header
    before its pixels are decoded: another format, or an image of another size, is a DataError (no other decoder
    runs, and no image larger than the data set's is decompressed)."""
    from PIL import Image, UnidentifiedImageError

    if ends.ndim != 1 or np.any(np.diff(ends) <= 0) or (len(ends) and (ends[0] <= 0 or ends[-1] > data.size)):
        raise DataError("its image offsets are not increasing within its image bytes")
    out = np.empty((len(ends), *shape), dtype=np.uint8)
    start = 0
    raw = data.tobytes()
    for i, end in enumerate(ends.tolist()):
        try:
            image = Image.open(io.BytesIO(raw[start:end]), formats=["WEBP"])
        except (UnidentifiedImageError, OSError) as exc:
            raise DataError(f"image {i} of the export is not a WebP image ({exc})") from None
        if image.size != (shape[2], shape[1]):
            raise DataError(
                f"image {i} of the export is {image.size[0]}x{image.size[1]}, the data set's {shape[2]}x{shape[1]}"
            )
        picture = np.asarray(image)
        if picture.ndim == 2:
            picture = picture[:, :, None]
        if shape[0] == 1 and picture.shape[2] >= 3:  # WebP has no grey images: a grey one decodes as equal R, G, B
            if not (
                np.array_equal(picture[:, :, 0], picture[:, :, 1])
                and np.array_equal(picture[:, :, 0], picture[:, :, 2])
            ):
                raise DataError(f"image {i} of the export is not grey, yet the data set has one channel")
            picture = picture[:, :, :1]
        out[i] = picture[:, :, : shape[0]].transpose(2, 0, 1)
        start = end
    return out


CHECKSUM = "checksum"  # sha256 over every other array of the file (name, dtype, shape, bytes), sorted by name
MAX_SIDE = 4096  # an image side beyond this is no data set this project reads
DTYPES = ("uint8", "float32")


def _digest(arrays: Any) -> str:
    """sha256 of the arrays of an export (a mapping name -> array) but its checksum, in a fixed order."""
    digest = hashlib.sha256()
    for name in sorted(k for k in arrays.keys() if k != CHECKSUM):
        value = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def _checked(z: Any, path: Path) -> tuple[tuple[int, ...], int]:
    """The image shape and the row count of an opened export after the checks that come before any use: its
    checksum, and labels, rows and sizes within what the data set it names can hold (DataError otherwise)."""
    if CHECKSUM not in z:
        raise DataError(
            f"data export {path}: it carries no checksum (an older export): write it again with `pflower export`"
        )
    if str(z[CHECKSUM]) != _digest(z):
        raise DataError(f"data export {path}: its checksum does not match its content (damaged in transfer?)")
    shape = tuple(int(d) for d in z["x_shape"])
    n, num_classes = int(z["n"]), int(z["num_classes"])
    y, index = z["y"], z["index"]
    problems = []
    # (channels, height, width) for images; (channels, length) for a time series such as HAR's 9 x 128
    if len(shape) not in (2, 3) or not all(0 < d <= MAX_SIDE for d in shape):
        problems.append(f"image shape {shape}")
    if str(z["x_dtype"]) not in DTYPES:
        problems.append(f"image dtype {z['x_dtype']}")
    if not 0 < num_classes <= 100_000 or y.ndim != 1 or len(y) != n or not np.issubdtype(y.dtype, np.integer):
        problems.append(f"{len(y)} labels of {y.dtype} for {n} rows and {num_classes} classes")
    elif len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        problems.append(f"labels outside 0..{num_classes - 1}")
    if (
        index.ndim != 1
        or not np.issubdtype(index.dtype, np.integer)
        or (len(index) and (index.min() < 0 or index.max() >= n))
    ):
        problems.append("rows outside the data set")
    elif np.any(np.diff(index) <= 0):
        problems.append("rows not increasing")
    images = len(z["x_webp_ends"]) if "x_webp" in z else len(z["x"])
    if images != len(index):
        problems.append(f"{images} images for {len(index)} rows")
    if problems:
        raise DataError(f"data export {path}: refused: {'; '.join(problems)}")
    return shape, n


def write_export(data: DatasetArrays, rows: Iterable[int], path: Path, webp: bool = False) -> int:
    """Write the given rows of a data set and all its labels to `path` (.npz) with a checksum of its content;
    returns the file's size."""
    index = np.array(sorted(rows), dtype=np.int64)
    x = data.x[index]
    extra: dict[str, Any] = {}
    if data.domain is not None:
        extra["domain"] = data.domain
    if data.natural_id is not None:
        extra["natural_id"] = data.natural_id
    if webp:
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1] not in (1, 3):
            raise DataError(f"{data.name}: WebP stores uint8 images of 1 or 3 channels, not {x.dtype} {x.shape[1:]}")
        extra["x_webp"], extra["x_webp_ends"] = _webp(x)
        x = np.zeros((0, *x.shape[1:]), dtype=np.uint8)
    arrays = {
        "name": data.name,
        "x": x,
        "x_shape": np.asarray(data.x.shape[1:]),
        "x_dtype": str(data.x.dtype),
        "index": index,
        "n": len(data.y),
        "y": data.y,
        "num_classes": data.num_classes,
        "mean": np.asarray(data.mean),
        "std": np.asarray(data.std),
        "scale": data.scale,
        "domain_names": np.array(data.domain_names),
        "natural_kind": data.natural_kind,
        **extra,
    }
    arrays = {name: np.asarray(value) for name, value in arrays.items()}  # as np.load gives them back
    arrays[CHECKSUM] = np.asarray(_digest(arrays))
    np.savez_compressed(path, **arrays)
    return Path(path).stat().st_size


def read_export(path: Path) -> tuple[DatasetArrays, set[int]]:
    """The data set an export stands for (its rows in place, zeros in the rows it does not hold, which the runs it
    was made for never read) and the rows it holds. Only numeric arrays: nothing is unpickled."""
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"data export {path}: not readable ({exc})") from None
    with z:
        try:
            shape, n = _checked(z, path)
            held = z["x"] if "x_webp" not in z else _unwebp(z["x_webp"], z["x_webp_ends"], shape)
        except (KeyError, ValueError) as exc:
            raise DataError(f"data export {path}: not an export of `pflower export` ({exc})") from None
        except DataError as exc:
            raise DataError(str(exc) if str(exc).startswith("data export") else f"data export {path}: {exc}") from None
        if held.shape[1:] != shape:
            raise DataError(f"data export {path}: its images are {held.shape[1:]}, its data set's {shape}")
        x = np.zeros((n, *shape), dtype=str(z["x_dtype"]))
        x[z["index"]] = held
        data = DatasetArrays(
            str(z["name"]),
            x,
            z["y"],
            int(z["num_classes"]),
            tuple(z["mean"].tolist()),
            tuple(z["std"].tolist()),
            float(z["scale"]),
            z["domain"] if "domain" in z else None,
            tuple(z["domain_names"].tolist()),
            z["natural_id"] if "natural_id" in z else None,
            str(z["natural_kind"]),
        )
        return data, set(z["index"].tolist())


def probe_export(path: Path) -> str:
    """The name of the data set an export holds, after decoding its first image as a run would: DataError, in a
    second, for a file that is no export of `pflower export` or whose images do not decode to the data set's shape
    (before any run starts, not in every run). Only numeric arrays: nothing is unpickled."""
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"data export {path}: not readable ({exc})") from None
    with z:
        try:
            shape, _ = _checked(z, path)
            name = str(z["name"])
            if "x_webp" in z:
                ends = z["x_webp_ends"][:1]
                _unwebp(z["x_webp"][: int(ends[0]) if len(ends) else 0], ends, shape)
            elif z["x"].shape[1:] != shape:
                raise DataError(f"its images are {z['x'].shape[1:]}, its data set's {shape}")
        except DataError as exc:
            if str(exc).startswith("data export"):
                raise
            raise DataError(
                f"data export {path}: its first image does not decode ({exc}); write it again with `pflower export`"
            ) from None
        except (KeyError, ValueError, OSError) as exc:
            raise DataError(
                f"data export {path}: its first image does not decode ({exc}); write it again with `pflower export`"
            ) from None
    return name


def serve_export(path: Path) -> set[int]:
    """Serve the data set from an export in this process (every load of its data set name returns it), and in the
    processes this one starts (through the environment); returns the rows it holds."""
    data, held = read_export(path)

    def source(name: str) -> DatasetArrays:
        if name != data.name:
            raise DataError(f"the data export {path} holds {data.name}, not {name}")
        return data

    use_data_source(source)
    os.environ[ENV] = str(Path(path).resolve())
    return held


def check_export(held: set[int], data: DataSettings, clients: int, path: Path) -> None:
    """DataError unless the export holds every row this run reads."""
    missing = rows_read(data, clients) - held
    if missing:
        raise DataError(
            f"the data export {path} lacks {len(missing):,} of the samples this run reads: export it "
            "with the same settings (seed, clients, partition, max-samples)"
        )
