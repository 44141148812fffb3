"""Reply validation: every kind of bad payload is rejected with a reason; good ones pass unchanged."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord

from common.wire.validation import PayloadError, read_count, read_finite, read_fraction, validate_arrays

SPECS = [("w", (2, 3)), ("b", (3,))]


def _good() -> dict[str, np.ndarray]:
    return {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}


def _record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(v) for k, v in arrays.items()})


def test_good_payload_round_trips() -> None:
    out = validate_arrays(_record(_good()), SPECS)
    assert np.array_equal(out[0], _good()["w"]) and np.array_equal(out[1], _good()["b"])


def _raw_array(data: bytes, dtype: str = "float32", shape: tuple[int, ...] = (3,)) -> Array:
    return Array(dtype=dtype, shape=tuple(shape), stype="numpy.ndarray", data=data)


def _npy(value: np.ndarray, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, value, allow_pickle=allow_pickle)
    return buf.getvalue()


BAD_CASES = {
    "missing record": (None, "missing 'arrays'"),
    "missing key": (_record({"w": _good()["w"]}), "missing"),
    "extra key": (_record({**_good(), "z": np.zeros(1, np.float32)}), "unexpected"),
    "float64": (_record({**_good(), "b": np.ones(3, np.float64)}), "dtype"),
    "int32": (_record({**_good(), "b": np.ones(3, np.int32)}), "dtype"),
    "wrong shape": (_record({**_good(), "w": np.zeros((3, 2), np.float32)}), "shape"),
    "nan": (_record({**_good(), "b": np.array([0, np.nan, 1], np.float32)}), "NaN or Inf"),
    "inf": (_record({**_good(), "b": np.array([0, np.inf, 1], np.float32)}), "NaN or Inf"),
    "huge": (_record({**_good(), "b": np.array([0, 3e7, 1], np.float32)}), "magnitude"),
    "declared shape lies": (
        ArrayRecord({"w": Array(_good()["w"]), "b": _raw_array(_npy(np.ones(4, np.float32)))}),
        "decodes to",
    ),
    "truncated bytes": (
        ArrayRecord({"w": Array(_good()["w"]), "b": _raw_array(_npy(np.ones(3, np.float32))[:-5])}),
        "does not decode",
    ),
    "garbage bytes": (ArrayRecord({"w": Array(_good()["w"]), "b": _raw_array(b"\x00garbage")}), "does not decode"),
    "pickled object array": (
        ArrayRecord(
            {
                "w": Array(_good()["w"]),
                "b": _raw_array(_npy(np.array([object(), 1, 2], dtype=object), allow_pickle=True)),
            }
        ),
        "does not decode",
    ),
    "not numpy": (
        ArrayRecord(
            {"w": Array(_good()["w"]), "b": Array(dtype="float32", shape=(3,), stype="torch.Tensor", data=b"x")}
        ),
        "serialization",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_payload_rejected_with_reason(case: str) -> None:
    record, reason = BAD_CASES[case]
    with pytest.raises(PayloadError, match=reason):
        validate_arrays(record, SPECS)


def test_pickle_payload_never_executes() -> None:
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled!')",))

    payload = pickle.dumps(Boom())
    record = ArrayRecord({"w": Array(_good()["w"]), "b": _raw_array(payload)})
    with pytest.raises(PayloadError):
        validate_arrays(record, SPECS)


@pytest.mark.parametrize("value", [None, "3", 2.5, -1, 0, True, float("nan"), 10**12])
def test_bad_counts_rejected(value) -> None:
    metrics = MetricRecord({}) if value is None else {"num-examples": value}
    with pytest.raises(PayloadError):
        read_count(metrics, "num-examples")


def test_metric_readers() -> None:
    assert read_count(MetricRecord({"n": 5}), "n") == 5
    assert read_count({"n": 0}, "n", allow_zero=True) == 0
    assert read_fraction({"a": 0.25}, "a") == 0.25
    with pytest.raises(PayloadError):
        read_fraction({"a": 1.5}, "a")
    with pytest.raises(PayloadError):
        read_finite({"l": float("inf")}, "l")


def test_the_same_bytes_are_checked_once_and_new_bytes_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    import common.wire.validation as validation

    decoded: list[int] = []
    real = validation.decode_npy
    monkeypatch.setattr(validation, "decode_npy", lambda data: decoded.append(len(data)) or real(data))
    monkeypatch.setattr(validation, "_VALIDATED", validation.PayloadMemo())
    record = _record(_good())
    first = validate_arrays(record, SPECS)
    again = validate_arrays(record, SPECS)  # the same bytes objects: the first result, nothing decoded again
    assert len(decoded) == 2 and all(a is b for a, b in zip(first, again))
    with pytest.raises(PayloadError, match="magnitude"):  # another bound is another check
        validate_arrays(record, SPECS, max_abs=4.0)
    assert len(decoded) == 3  # "w" decoded, and refused
    with pytest.raises(PayloadError, match="magnitude"):  # a check that failed is never remembered as passed
        validate_arrays(record, SPECS, max_abs=4.0)
    assert len(decoded) == 4
    nan = {**_good(), "b": np.array([0, np.nan, 1], np.float32)}
    with pytest.raises(PayloadError, match="NaN or Inf"):  # equal names and shapes, other bytes: checked anew
        validate_arrays(_record(nan), SPECS)
