"""ArrayRecords built from numpy: the same bytes as Flower's own Array(ndarray), made faster."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array

from common.wire.records import numpy_array, to_plain_record, to_record

CASES = {
    "0-d": np.zeros((), np.float32),
    "empty": np.zeros((0, 3), np.float32),
    "uint8": np.arange(7, dtype=np.uint8),
    "bool": np.array([[True, False, True]] * 2),
    "float32": np.random.default_rng(0).random((5, 4)).astype(np.float32),
    "int64": np.arange(6, dtype=np.int64).reshape(2, 3),
    "big-endian": np.arange(4, dtype=">f4"),
    "header past format 1.0": np.zeros(2, dtype=[(f"field{i}", "<f4") for i in range(4000)]),
}


@pytest.mark.parametrize("name", CASES)
def test_the_bytes_are_flowers_own(name: str) -> None:
    value = CASES[name]
    ours, flowers = numpy_array(value), Array(value)
    assert (ours.data, ours.dtype, tuple(ours.shape), ours.stype) == (
        flowers.data,
        flowers.dtype,
        tuple(flowers.shape),
        flowers.stype,
    )
    if name != "header past format 1.0":  # numpy refuses to load such headers unless told to
        assert np.array_equal(ours.numpy(), value)


def test_records_keep_order_dtype_and_shape() -> None:
    record = to_record(["b", "a"], [np.ones((2, 2), np.float64), np.zeros((), np.float32)])
    assert list(record) == ["b", "a"] and record["b"].dtype == "float32" and tuple(record["a"].shape) == ()
    plain = to_plain_record({"bits": np.asfortranarray(np.ones((3, 2), np.uint8))})
    assert plain["bits"].data == Array(np.ones((3, 2), np.uint8)).data, "made C-contiguous first"
