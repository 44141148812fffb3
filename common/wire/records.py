"""Named numpy arrays <-> Flower ArrayRecord (the one place in common/ that touches Flower types)."""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from flwr.app import Array, ArrayRecord
from numpy.lib import format as npy_format


def numpy_array(value: np.ndarray) -> Array:
    """Array(value) for a C-contiguous array: the same `.npy` bytes as Flower's np.save into a BytesIO, made with
    one copy of the values instead of three (a model's upload is the bulk of what a client spends on its reply)."""
    header = io.BytesIO()
    try:
        npy_format.write_array_header_1_0(header, npy_format.header_data_from_array_1_0(value))
        data = b"".join([header.getvalue(), value.data.cast("B")]) if value.size else header.getvalue()
    except (ValueError, TypeError):  # a header too long for format 1.0 (np.save writes 2.0), an unusual dtype
        return Array(value)
    return Array(dtype=str(value.dtype), shape=tuple(value.shape), stype="numpy.ndarray", data=data)


def to_record(names: Sequence[str], arrays: Sequence[np.ndarray]) -> ArrayRecord:
    """An ArrayRecord of float32 arrays keyed by `names` (state-dict order is kept)."""
    if len(names) != len(arrays):
        raise ValueError(f"{len(names)} names for {len(arrays)} arrays")
    # np.require keeps 0-d entries (e.g. batch norm's num_batches_tracked) 0-d; ascontiguousarray would make them 1-d
    return ArrayRecord(
        {n: numpy_array(np.require(a, dtype=np.float32, requirements="C")) for n, a in zip(names, arrays)}
    )


def to_plain_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """An ArrayRecord of arrays kept in their own dtypes (packed masks, ids, values), keyed by name."""
    return ArrayRecord({n: numpy_array(np.require(a, requirements="C")) for n, a in arrays.items()})


def flatten(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """All arrays as one float32 vector (state-dict order)."""
    if not arrays:
        return np.zeros(0, np.float32)
    return np.concatenate([np.asarray(a, dtype=np.float32).ravel() for a in arrays])


def unflatten(vector: np.ndarray, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """Split a flat vector back into arrays of the given shapes."""
    sizes = [int(np.prod(shape)) for shape in shapes]
    if vector.size != sum(sizes):
        raise ValueError(f"vector has {vector.size} values, the shapes need {sum(sizes)}")
    out, start = [], 0
    for shape, size in zip(shapes, sizes):
        out.append(vector[start : start + size].reshape(shape))
        start += size
    return out
