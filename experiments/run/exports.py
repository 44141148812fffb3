"""A data export: the samples a set of runs reads (their clients' train, test and shift-draw rows, the domains' test
rows) and every label, in one file, for a machine without the data sets (a rented GPU); served in place of the data
set there, the runs see the very same partitions and tensors. Images may be stored as lossless WebP (about 0.6 of
their bytes on CIFAR-10), which PIL decodes back bit for bit.

    pflower export bench/sweeps/results.toml --experiments cifar-dmpfl --set num-rounds=300 --out cifar.npz
    python -m experiments.engine --data-export cifar.npz --run-config '...' --clients 100   # there
"""

from __future__ import annotations

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
    """The images `_webp` stored, uint8 (N, C, H, W)."""
    from PIL import Image

    out = np.empty((len(ends), *shape), dtype=np.uint8)
    start = 0
    raw = data.tobytes()
    for i, end in enumerate(ends.tolist()):
        picture = np.asarray(Image.open(io.BytesIO(raw[start:end])))
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


def write_export(data: DatasetArrays, rows: Iterable[int], path: Path, webp: bool = False) -> int:
    """Write the given rows of a data set and all its labels to `path` (.npz); returns the file's size."""
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
    np.savez_compressed(
        path,
        name=data.name,
        x=x,
        x_shape=np.asarray(data.x.shape[1:]),
        x_dtype=str(data.x.dtype),
        index=index,
        n=len(data.y),
        y=data.y,
        num_classes=data.num_classes,
        mean=np.asarray(data.mean),
        std=np.asarray(data.std),
        scale=data.scale,
        domain_names=np.array(data.domain_names),
        natural_kind=data.natural_kind,
        **extra,
    )
    return Path(path).stat().st_size


def read_export(path: Path) -> tuple[DatasetArrays, set[int]]:
    """The data set an export stands for (its rows in place, zeros in the rows it does not hold, which the runs it
    was made for never read) and the rows it holds. Only numeric arrays: nothing is unpickled."""
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"data export {path}: not readable ({exc})") from None
    with z:
        shape = tuple(int(d) for d in z["x_shape"])
        held = z["x"] if "x_webp" not in z else _unwebp(z["x_webp"], z["x_webp_ends"], shape)
        x = np.zeros((int(z["n"]), *shape), dtype=str(z["x_dtype"]))
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
            name, shape = str(z["name"]), tuple(int(d) for d in z["x_shape"])
            if "x_webp" in z:
                ends = z["x_webp_ends"][:1]
                _unwebp(z["x_webp"][: int(ends[0]) if len(ends) else 0], ends, shape)
            elif z["x"].shape[1:] != shape:
                raise DataError(f"its images are {z['x'].shape[1:]}, its data set's {shape}")
        except (KeyError, ValueError, OSError, DataError) as exc:
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
