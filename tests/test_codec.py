"""Sparse wire codec: exact round trips, strict rejection of every corrupted payload, byte counts."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import numpy as np
import pytest

from common.wire.codec import (
    SparseTensor,
    decode_model,
    decode_sparse,
    encode_model,
    encode_sparse,
    encode_values,
    from_arrays,
    mask_digest,
    pack_mask,
    sparse_nbytes,
    to_arrays,
    unpack_mask,
)
from common.wire.validation import PayloadError

SHAPES = [(1,), (7,), (8,), (9,), (1000,), (3, 3), (2, 4), (1, 1, 1), (3, 1, 3), (2, 3, 4, 5), (10, 10, 10)]
DENSITIES = [0.0, 0.01, 0.3, 0.5, 0.99, 1.0]


def _sample(shape: tuple[int, ...], density: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A random float32 tensor and a bool mask of about `density` (exactly 0 / all for 0 and 1)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    mask = rng.random(shape) < density
    if density == 1.0:
        mask[...] = True
    return x, mask


def _masked(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """x on the mask, +0.0 off it (x * mask would leave -0.0 for negative x)."""
    return np.where(mask, x, np.float32(0.0)).astype(np.float32)


def _assert_exact(got: tuple[np.ndarray, np.ndarray], x: np.ndarray, mask: np.ndarray) -> None:
    dense, out_mask = got
    assert dense.dtype == np.float32 and dense.shape == x.shape
    assert dense.tobytes() == _masked(x, mask).tobytes()
    assert out_mask.dtype == np.bool_ and np.array_equal(out_mask, mask)


@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip_is_exact(shape: tuple[int, ...], density: float) -> None:
    x, mask = _sample(shape, density)
    payload = encode_sparse(_masked(x, mask), mask)
    assert payload.bits is not None and payload.bits.dtype == np.uint8
    assert payload.bits.size == math.ceil(x.size / 8) and payload.values.size == mask.sum()
    _assert_exact(decode_sparse(payload, shape), x, mask)
    _assert_exact(decode_sparse(from_arrays("w", to_arrays("w", payload)), shape), x, mask)


@pytest.mark.parametrize("density", DENSITIES)
def test_model_round_trip_is_exact(density: float) -> None:
    tensors = {f"t{i}": _sample(s, density, seed=i) for i, s in enumerate(SHAPES)}
    dense = {n: _masked(x, m) for n, (x, m) in tensors.items()}
    dense["bias"] = np.arange(5, dtype=np.float32) - 2
    arrays = encode_model(dense, {n: m for n, (_, m) in tensors.items()})
    assert arrays["bias/dense"].dtype == np.float32
    shapes = {n: a.shape for n, a in dense.items()}
    got, masks = decode_model(arrays, shapes)
    assert set(masks) == set(tensors) and np.array_equal(got["bias"], dense["bias"])
    for name, (x, mask) in tensors.items():
        _assert_exact((got[name], masks[name]), x, mask)
    values, value_masks = decode_model(arrays, shapes, sparse_as_values=True)  # what the server aggregates
    assert np.array_equal(values["bias"], dense["bias"])
    for name, (x, mask) in tensors.items():
        assert values[name].ndim == 1 and np.array_equal(values[name], x[mask])
        assert np.array_equal(value_masks[name], mask)
    arrays["t0/values"] = np.append(arrays["t0/values"], np.float32(1))
    with pytest.raises(PayloadError, match="nnz"):
        decode_model(arrays, shapes, sparse_as_values=True)


def test_round_trip_through_flower_arrays() -> None:
    from flwr.app import Array, ArrayRecord  # the codec itself is Flower-free; only the test checks transport

    x, mask = _sample((5, 9), 0.3)
    arrays = {
        **encode_model({"w": x, "b": np.ones(2, np.float32)}, {"w": mask}),
        **encode_model({"v": x}, {"v": mask}, values_only=True, value_dtype="float16"),
    }
    record = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    received = {k: a.numpy() for k, a in record.items()}
    assert all(received[k].dtype == v.dtype and received[k].shape == v.shape for k, v in arrays.items())
    got, masks = decode_model({k: v for k, v in received.items() if not k.startswith("v/")}, {"w": (5, 9), "b": (2,)})
    _assert_exact((got["w"], masks["w"]), x, mask)
    got, _ = decode_model(
        {k: v for k, v in received.items() if k.startswith("v/")}, {"v": (5, 9)}, {"v": mask}, value_dtype="float16"
    )
    assert np.allclose(got["v"], _masked(x, mask), atol=1e-2, rtol=1e-3)


def test_values_only_round_trip_with_known_mask() -> None:
    x, mask = _sample((4, 6), 0.4)
    payload = encode_values(x, mask)
    assert payload.bits is None and payload.digest == mask_digest(mask)
    arrays = to_arrays("w", payload)
    assert "w/bits" not in arrays
    _assert_exact(decode_sparse(from_arrays("w", arrays), (4, 6), known_mask=mask), x, mask)
    got, masks = decode_model(encode_model({"w": x}, {"w": mask}, values_only=True), {"w": (4, 6)}, {"w": mask})
    _assert_exact((got["w"], masks["w"]), x, mask)


def test_values_only_with_wrong_known_mask_is_rejected() -> None:
    x, mask = _sample((4, 6), 0.4)
    other = mask.copy()
    other.flat[[0, 1]] = ~other.flat[[0, 1]]  # same shape, different mask
    with pytest.raises(PayloadError, match="digest"):
        decode_sparse(encode_values(x, mask), (4, 6), known_mask=other)
    with pytest.raises(PayloadError, match="known mask"):
        decode_sparse(encode_values(x, mask), (4, 6))


def test_mask_digest_depends_on_shape_and_bits_and_is_stable_across_processes() -> None:
    mask = np.zeros((2, 8), dtype=bool)
    mask[0, 3] = True
    assert mask_digest(mask) != mask_digest(mask.reshape(4, 4)) != mask_digest(~mask)
    assert 0 <= mask_digest(mask) < 2**63
    code = (
        "import numpy as np; from common.wire.codec import mask_digest; m = np.zeros((2, 8), bool); m[0, 3] = True; "
        "print(mask_digest(m))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == mask_digest(mask)


def test_pack_mask_is_row_major_packbits() -> None:
    mask = np.array([[1, 0, 0], [0, 0, 0], [0, 0, 1]], dtype=bool)
    assert pack_mask(mask).tolist() == [0b10000000, 0b10000000]
    assert np.array_equal(unpack_mask(pack_mask(mask), (3, 3)), mask)


# --- corruptions: each must raise PayloadError, never return a tensor ---


def _good() -> tuple[SparseTensor, np.ndarray]:
    x, mask = _sample((3, 5), 0.5, seed=3)  # N = 15: one padding bit in the second byte
    assert 0 < mask.sum() < 15
    return encode_sparse(x, mask), mask


def _with(**changes: object) -> SparseTensor:
    return dataclasses.replace(_good()[0], **changes)


def _reject(payload: SparseTensor, match: str, shape: tuple[int, ...] = (3, 5), **kwargs: object) -> None:
    with pytest.raises(PayloadError, match=match):
        decode_sparse(payload, shape, **kwargs)


def test_good_payload_decodes() -> None:
    payload, mask = _good()
    assert np.array_equal(decode_sparse(payload, (3, 5))[1], mask)


def test_truncated_bits_are_rejected() -> None:
    _reject(_with(bits=_good()[0].bits[:-1]), "bytes")


def test_extra_bits_byte_is_rejected() -> None:
    _reject(_with(bits=np.append(_good()[0].bits, np.uint8(0))), "bytes")


def test_nonzero_padding_bits_are_rejected() -> None:
    bits = _good()[0].bits.copy()
    bits[-1] |= 1  # position 15 of 16 lies past N = 15
    _reject(_with(bits=bits), "padding")
    with pytest.raises(PayloadError, match="padding"):
        unpack_mask(bits, (3, 5))


@pytest.mark.parametrize("delta", [1, -1])
def test_nnz_mismatch_is_rejected(delta: int) -> None:
    values = _good()[0].values
    values = np.append(values, np.float32(1.0)) if delta > 0 else values[:-1]
    _reject(_with(values=values), "nnz mismatch")


def test_wrong_digest_is_rejected() -> None:
    _reject(_with(digest=(_good()[0].digest + 1) % 2**63), "digest mismatch")
    _reject(_with(digest=-1), "digest")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_rejected(bad: float) -> None:
    values = _good()[0].values.copy()
    values[0] = bad
    _reject(_with(values=values), "NaN or Inf")


def test_huge_values_are_rejected() -> None:
    values = _good()[0].values.copy()
    values[0] = 1e7
    _reject(_with(values=values), "magnitude")


@pytest.mark.parametrize(
    "values",
    [
        lambda v: v.astype(np.float64),
        lambda v: v.astype(np.int32),
        lambda v: v.reshape(1, -1),
        lambda v: v.astype(np.float16),  # float16 only when the switch asks for it
    ],
)
def test_bad_value_dtype_or_dims_are_rejected(values) -> None:
    _reject(_with(values=values(_good()[0].values)), "values must be")


def test_wrong_shape_is_rejected() -> None:
    _reject(_good()[0], "shape", shape=(5, 3))
    _reject(_good()[0], "shape", shape=(15,))


def test_int8_bits_are_rejected() -> None:
    _reject(_with(bits=_good()[0].bits.astype(np.int8)), "uint8")


@pytest.mark.parametrize("key", ["w/shape", "w/values", "w/digest"])
def test_missing_key_is_rejected(key: str) -> None:
    arrays = to_arrays("w", _good()[0])
    del arrays[key]
    with pytest.raises(PayloadError, match=key):
        from_arrays("w", arrays)


@pytest.mark.parametrize(
    "key,value",
    [
        ("w/shape", np.array([3, 5], dtype=np.int32)),
        ("w/shape", np.array([3, -5], dtype=np.int64)),
        ("w/bits", np.zeros(2, dtype=np.int8)),
        ("w/values", np.zeros(8, dtype=np.float64)),
        ("w/digest", np.array([1, 2], dtype=np.int64)),
        ("w/digest", np.array([1.0])),
    ],
)
def test_bad_array_in_record_is_rejected(key: str, value: np.ndarray) -> None:
    arrays = to_arrays("w", _good()[0])
    arrays[key] = value
    with pytest.raises(PayloadError, match=key):
        from_arrays("w", arrays)


def test_model_with_missing_unexpected_or_mixed_names_is_rejected() -> None:
    payload, mask = _good()
    arrays = encode_model({"w": decode_sparse(payload, (3, 5))[0], "b": np.zeros(3, np.float32)}, {"w": mask})
    shapes = {"w": (3, 5), "b": (3,)}
    decode_model(arrays, shapes)
    with pytest.raises(PayloadError, match="missing"):
        decode_model({k: v for k, v in arrays.items() if not k.startswith("b/")}, shapes)
    with pytest.raises(PayloadError, match="unexpected"):
        decode_model({**arrays, "c/dense": np.zeros(1, np.float32)}, shapes)
    with pytest.raises(PayloadError, match="unexpected key"):
        decode_model({**arrays, "w/extra": np.zeros(1, np.float32)}, shapes)
    with pytest.raises(PayloadError, match="both dense and sparse"):
        decode_model({**arrays, "w/dense": np.zeros((3, 5), np.float32)}, shapes)
    with pytest.raises(PayloadError, match="'b'"):
        decode_model({**arrays, "b/dense": np.zeros(4, np.float32)}, shapes)
    with pytest.raises(PayloadError, match="NaN"):
        decode_model({**arrays, "b/dense": np.full(3, np.nan, np.float32)}, shapes)
    with pytest.raises(PayloadError, match="tensor 'w'.*nnz"):
        decode_model({**arrays, "w/values": arrays["w/values"][:-1]}, shapes)


# --- byte counts ---


def test_sparse_nbytes_on_hand_computed_examples() -> None:
    mask = np.zeros(20, dtype=bool)
    mask[[0, 5, 19]] = True
    x = np.ones(20, dtype=np.float32)
    assert sparse_nbytes(encode_sparse(x, mask)) == 3 + 4 * 3 + 8  # ceil(20/8) = 3
    assert sparse_nbytes(encode_values(x, mask)) == 4 * 3 + 8
    assert sparse_nbytes(encode_sparse(np.ones(8, np.float32), np.ones(8, bool))) == 1 + 32 + 8
    assert sparse_nbytes(encode_sparse(x, mask, value_dtype="float16")) == 3 + 2 * 3 + 8


def test_sparse_nbytes_matches_array_bytes() -> None:
    x, mask = _sample((37, 11), 0.3)
    payload = encode_sparse(x, mask)
    arrays = to_arrays("w", payload)
    assert sparse_nbytes(payload) == sum(arrays[f"w/{k}"].nbytes for k in ("bits", "values", "digest"))


def test_half_density_is_smaller_than_dense() -> None:
    x, mask = _sample((100, 100), 0.5)
    mask.flat[:] = np.arange(mask.size) % 2 == 0  # exactly 50%
    n = x.size
    assert sparse_nbytes(encode_sparse(x, mask)) == n // 8 + 4 * (n // 2) + 8 < 4 * n


# --- float16 switch ---


def test_float16_values_decode_to_float32() -> None:
    x, mask = _sample((6, 7), 0.5)
    payload = encode_sparse(x, mask, value_dtype="float16")
    assert payload.values.dtype == np.float16
    dense, out_mask = decode_sparse(from_arrays("w", to_arrays("w", payload)), (6, 7), value_dtype="float16")
    assert dense.dtype == np.float32 and np.array_equal(out_mask, mask)
    assert np.allclose(dense, _masked(x, mask), atol=1e-2, rtol=1e-3)
    with pytest.raises(PayloadError, match="values must be"):
        decode_sparse(payload, (6, 7))  # float32 expected by default


def test_float16_overflow_is_rejected_by_receiver() -> None:
    x = np.full(4, 1e5, dtype=np.float32)  # above float16 max (65504)
    with pytest.warns(RuntimeWarning, match="overflow"):
        payload = encode_sparse(x, np.ones(4, bool), value_dtype="float16")
    with pytest.raises(PayloadError, match="NaN or Inf"):
        decode_sparse(payload, (4,), value_dtype="float16")
