"""Sparse wire codec: dense tensor + bool mask <-> packed bitmask and values as plain numpy arrays."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from common.methods.masked_ops import gather, scatter
from common.wire.validation import MAX_ABS_VALUE, PayloadError, check_values

VALUE_DTYPES = ("float32", "float16")  # float16 is the lossy, off-by-default switch
SUFFIXES = ("shape", "bits", "values", "digest", "dense")
MAX_NDIM = 32


@dataclass(frozen=True)
class SparseTensor:
    """A masked tensor on the wire: shape, packed mask bits (None when values-only), values, mask digest."""

    shape: tuple[int, ...]
    bits: np.ndarray | None
    values: np.ndarray
    digest: int


def pack_mask(mask: np.ndarray) -> np.ndarray:
    """The flattened (row-major) bool mask packed 8 positions per uint8, length ceil(N/8)."""
    mask = np.asarray(mask)
    if mask.dtype != np.bool_:
        raise ValueError(f"mask must be bool, got {mask.dtype}")
    return np.packbits(mask.reshape(-1))


def unpack_mask(bits: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The bool mask of `shape` from packed bits; PayloadError on wrong dtype, length or nonzero padding."""
    if not isinstance(bits, np.ndarray) or bits.dtype != np.uint8 or bits.ndim != 1:
        raise PayloadError(f"mask bits must be a 1-D uint8 array, got {getattr(bits, 'dtype', type(bits))}")
    n = math.prod(shape)
    if bits.size != (n + 7) // 8:
        raise PayloadError(f"mask bits have {bits.size} bytes, expected {(n + 7) // 8} for shape {shape}")
    pad = (-n) % 8
    if pad and int(bits[-1]) & ((1 << pad) - 1):
        raise PayloadError("mask bits have nonzero padding after the last position")
    return np.unpackbits(bits, count=n).view(np.bool_).reshape(shape)  # 0/1 bytes: valid bools, no copy


def mask_digest(mask: np.ndarray) -> int:
    """A deterministic 63-bit digest of the mask's bits and shape (fits an int64 metric)."""
    mask = np.asarray(mask)
    return bits_digest(pack_mask(mask), mask.shape)


def bits_digest(bits: np.ndarray, shape: tuple[int, ...]) -> int:
    """mask_digest of the mask whose packed bits (zero padding) are `bits`."""
    h = hashlib.blake2b(digest_size=8)
    h.update(np.asarray(shape, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(bits, dtype=np.uint8).tobytes())
    return int.from_bytes(h.digest(), "big") % 2**63


def _masked_values(dense: np.ndarray, mask: np.ndarray, value_dtype: str) -> np.ndarray:
    """The values at set positions in row-major order, in the wire dtype."""
    if value_dtype not in VALUE_DTYPES:
        raise ValueError(f"value_dtype must be one of {VALUE_DTYPES}, got {value_dtype!r}")
    return gather(dense, mask).astype(value_dtype, copy=False)  # gather refuses a mask of another shape


def encode_sparse(dense: np.ndarray, mask: np.ndarray, value_dtype: str = "float32") -> SparseTensor:
    """Bits + values: the receiver learns the mask from the payload."""
    values = _masked_values(dense, mask, value_dtype)
    bits = pack_mask(mask)
    return SparseTensor(tuple(np.shape(mask)), bits, values, bits_digest(bits, np.shape(mask)))


def encode_values(dense: np.ndarray, mask: np.ndarray, value_dtype: str = "float32") -> SparseTensor:
    """Values only plus the mask digest: for when both sides already hold the mask."""
    values = _masked_values(dense, mask, value_dtype)
    return SparseTensor(tuple(np.shape(mask)), None, values, mask_digest(mask))


def decode_sparse(
    payload: SparseTensor,
    expected_shape: tuple[int, ...],
    known_mask: np.ndarray | None = None,
    value_dtype: str = "float32",
    max_abs: float = MAX_ABS_VALUE,
) -> tuple[np.ndarray, np.ndarray]:
    """(dense float32 with zeros off-mask, bool mask) from a validated payload; PayloadError otherwise.

    When the payload carries bits, `known_mask` is ignored (the sender's mask may legitimately differ).
    """
    values, mask = decode_sparse_values(payload, expected_shape, known_mask, value_dtype, max_abs)
    return scatter(values, mask), mask


def decode_sparse_values(
    payload: SparseTensor,
    expected_shape: tuple[int, ...],
    known_mask: np.ndarray | None = None,
    value_dtype: str = "float32",
    max_abs: float = MAX_ABS_VALUE,
) -> tuple[np.ndarray, np.ndarray]:
    """(values at the set positions, row-major, bool mask) from a payload validated as decode_sparse does: what an
    aggregation that never needs the dense tensor takes (no scatter into a fresh tensor per upload)."""
    expected = tuple(int(d) for d in expected_shape)
    if tuple(payload.shape) != expected:
        raise PayloadError(f"shape {tuple(payload.shape)} differs from the expected {expected}")
    values = payload.values
    if not isinstance(values, np.ndarray) or values.dtype != np.dtype(value_dtype) or values.ndim != 1:
        raise PayloadError(
            f"values must be a 1-D {value_dtype} array, got "
            f"{getattr(values, 'dtype', type(values))} {getattr(values, 'shape', '')}"
        )
    if (
        isinstance(payload.digest, bool)
        or not isinstance(payload.digest, (int, np.integer))
        or not 0 <= int(payload.digest) < 2**63
    ):
        raise PayloadError(f"mask digest {payload.digest!r} is not an integer in [0, 2**63)")
    if payload.bits is not None:
        mask = unpack_mask(payload.bits, expected)  # checks the length and the zero padding the digest relies on
        if bits_digest(payload.bits, expected) != int(payload.digest):
            raise PayloadError(
                f"mask digest mismatch: payload {payload.digest}, bits give {bits_digest(payload.bits, expected)}"
            )
    else:
        if known_mask is None:
            raise PayloadError("values-only payload but no known mask to decode it with")
        mask = np.asarray(known_mask)
        if mask.dtype != np.bool_ or mask.shape != expected:
            raise ValueError(f"known mask must be bool of shape {expected}, got {mask.dtype} {mask.shape}")
        if mask_digest(mask) != int(payload.digest):
            raise PayloadError(f"mask digest mismatch: payload {payload.digest}, known mask {mask_digest(mask)}")
    nnz = int(np.count_nonzero(mask))
    if values.size != nnz:
        raise PayloadError(f"nnz mismatch: {values.size} values for {nnz} set mask bits")
    check_values("values", values, max_abs)
    return values, mask


def sparse_nbytes(payload: SparseTensor) -> int:
    """Payload bytes: ceil(N/8) bitmask (when present) + itemsize*nnz values + 8 digest, no shape/.npy framing.

    A bitmask costs N/8 bytes whatever the density, whereas int32 indices cost 4*nnz and, with the
    4*nnz values, exceed dense 4*N above 50% density: hence the bitmask.
    """
    bits = 0 if payload.bits is None else (math.prod(payload.shape) + 7) // 8
    return bits + payload.values.itemsize * payload.values.size + 8


def to_arrays(name: str, payload: SparseTensor) -> dict[str, np.ndarray]:
    """Plain arrays for an ArrayRecord: name/shape, name/bits (when present), name/values, name/digest."""
    out = {f"{name}/shape": np.asarray(payload.shape, dtype=np.int64).reshape(-1)}
    if payload.bits is not None:
        out[f"{name}/bits"] = payload.bits
    out[f"{name}/values"] = payload.values
    out[f"{name}/digest"] = np.asarray([payload.digest], dtype=np.int64)
    return out


def _get(arrays: Mapping[str, np.ndarray], key: str, dtypes: tuple[str, ...], ndim: int) -> np.ndarray:
    """arrays[key], present, a numpy array of one of `dtypes` and `ndim` dims, else PayloadError."""
    if key not in arrays:
        raise PayloadError(f"missing key '{key}'")
    value = arrays[key]
    if not isinstance(value, np.ndarray) or value.dtype.name not in dtypes or value.ndim != ndim:
        raise PayloadError(
            f"key '{key}' must be a {ndim}-D {'/'.join(dtypes)} array, got "
            f"{getattr(value, 'dtype', type(value))} {getattr(value, 'shape', '')}"
        )
    return value


def from_arrays(name: str, arrays: Mapping[str, np.ndarray]) -> SparseTensor:
    """The SparseTensor stored under `name` by to_arrays, with presence, dtype and dims checked."""
    shape = _get(arrays, f"{name}/shape", ("int64",), 1)
    if shape.size > MAX_NDIM or np.any(shape < 0):
        raise PayloadError(f"key '{name}/shape' = {shape.tolist()} is not a valid shape")
    bits = _get(arrays, f"{name}/bits", ("uint8",), 1) if f"{name}/bits" in arrays else None
    values = _get(arrays, f"{name}/values", VALUE_DTYPES, 1)
    digest = _get(arrays, f"{name}/digest", ("int64",), 1)
    if digest.size != 1 or int(digest[0]) < 0:
        raise PayloadError(f"key '{name}/digest' must hold one non-negative int64, got {digest.tolist()}")
    return SparseTensor(tuple(int(d) for d in shape), bits, values, int(digest[0]))


def encode_model(
    dense: dict[str, np.ndarray], masks: dict[str, np.ndarray], values_only: bool = False, value_dtype: str = "float32"
) -> dict[str, np.ndarray]:
    """All tensors as plain arrays: masked ones sparse (or values-only), the rest under name/dense."""
    if set(masks) - set(dense):
        raise ValueError(f"masks for unknown tensors {sorted(set(masks) - set(dense))[:3]}")
    out: dict[str, np.ndarray] = {}
    for name, tensor in dense.items():
        if name in masks:
            encode = encode_values if values_only else encode_sparse
            out.update(to_arrays(name, encode(tensor, masks[name], value_dtype)))
        else:
            out[f"{name}/dense"] = np.require(tensor, dtype=np.float32, requirements="C")
    return out


def _group_keys(arrays: Mapping[str, np.ndarray]) -> dict[str, set[str]]:
    """Tensor name -> the suffixes received for it; PayloadError on a key of no known form."""
    groups: dict[str, set[str]] = {}
    for key in arrays:
        name, _, suffix = str(key).rpartition("/")
        if not name or suffix not in SUFFIXES:
            raise PayloadError(f"unexpected key '{key}'")
        groups.setdefault(name, set()).add(suffix)
    return groups


def decode_model(
    arrays: Mapping[str, np.ndarray],
    expected_shapes: dict[str, tuple[int, ...]],
    known_masks: dict[str, np.ndarray] | None = None,
    value_dtype: str = "float32",
    max_abs: float = MAX_ABS_VALUE,
    sparse_as_values: bool = False,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(dense tensors, masks of the tensors sent sparse) from encode_model's arrays, all validated;
    `sparse_as_values`: a tensor sent sparse comes as its 1-D values (decode_sparse_values), not dense."""
    groups = _group_keys(arrays)
    if set(groups) != set(expected_shapes):
        missing = sorted(set(expected_shapes) - set(groups))
        extra = sorted(set(groups) - set(expected_shapes))
        raise PayloadError(f"tensor names differ from the model's (missing {missing[:3]}, unexpected {extra[:3]})")
    dense: dict[str, np.ndarray] = {}
    masks: dict[str, np.ndarray] = {}
    for name, shape in expected_shapes.items():
        if "dense" in groups[name]:
            if groups[name] != {"dense"}:
                raise PayloadError(f"tensor '{name}' is sent both dense and sparse")
            value = _get(arrays, f"{name}/dense", ("float32",), len(shape))
            if value.shape != tuple(shape):
                raise PayloadError(f"tensor '{name}' has shape {value.shape}, expected {tuple(shape)}")
            check_values(f"tensor '{name}'", value, max_abs)
            dense[name] = value
        else:
            known = None if known_masks is None else known_masks.get(name)
            try:
                decode = decode_sparse_values if sparse_as_values else decode_sparse
                dense[name], masks[name] = decode(from_arrays(name, arrays), shape, known, value_dtype, max_abs)
            except PayloadError as exc:
                raise PayloadError(f"tensor '{name}': {exc}") from None
    return dense, masks
