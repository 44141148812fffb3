"""Validation of every received payload (either direction); a bad one raises PayloadError with the reason."""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from common.wire.messages import PHASE, SERVER_ROUND
from common.wire.payload_memo import PayloadMemo


class PayloadError(ValueError):
    """A reply that must not be used; the message says why."""


MAX_ABS_VALUE = 1e6  # a weight this large is corruption or an attack, not training
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")


def is_folder_name(value: object) -> bool:
    """True for one safe path component: letters, digits, '.', '_', '-', not starting with '.', at most 100
    characters (no separators, no '..', nothing absolute)."""
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


def validate_arrays(
    arrays: Mapping[str, Any] | None,
    specs: Sequence[tuple[str, tuple[int, ...]]],
    max_abs: float = MAX_ABS_VALUE,
    dtype: str = "float32",
) -> list[np.ndarray]:
    """Check a received ArrayRecord against the model's (name, shape) specs; return `dtype` arrays in order.

    Checks: record present, exactly the expected keys, numpy serialization, declared and actual dtype
    (float32 unless told) and shape equal to the model's, all values finite and below `max_abs` in magnitude.
    Arrays are decoded in place (read-only views of the received bytes), never with pickle.
    """
    if arrays is None:
        raise PayloadError("missing 'arrays' record")
    expected = [name for name, _ in specs]
    received = list(arrays.keys())
    if set(received) != set(expected):
        missing = sorted(set(expected) - set(received))
        extra = sorted(set(received) - set(expected))
        raise PayloadError(f"array keys differ from the model's (missing {missing[:3]}, unexpected {extra[:3]})")
    params = (tuple((name, tuple(shape)) for name, shape in specs), max_abs, dtype)
    return list(_VALIDATED.get(arrays, params, lambda: _checked(arrays, specs, max_abs, dtype)))


def _checked(
    arrays: Mapping[str, Any], specs: Sequence[tuple[str, tuple[int, ...]]], max_abs: float, dtype: str
) -> tuple[np.ndarray, ...]:
    """validate_arrays' checks, after the keys (its result as a tuple)."""
    out = []
    for name, shape in specs:
        item = arrays[name]
        if getattr(item, "stype", None) != "numpy.ndarray":
            raise PayloadError(f"array '{name}' has serialization {getattr(item, 'stype', None)!r}, not numpy")
        if getattr(item, "dtype", None) != dtype:
            raise PayloadError(f"array '{name}' declares dtype {getattr(item, 'dtype', None)!r}, expected {dtype}")
        if tuple(getattr(item, "shape", ())) != tuple(shape):
            raise PayloadError(f"array '{name}' declares shape {tuple(getattr(item, 'shape', ()))}, expected {shape}")
        try:
            value = decode_npy(item.data)  # in place, no pickle: object arrays are refused
        except Exception as exc:
            raise PayloadError(f"array '{name}' does not decode: {exc}") from None
        if value.dtype != np.dtype(dtype) or value.shape != tuple(shape):
            raise PayloadError(f"array '{name}' decodes to {value.dtype} {value.shape}, expected {dtype} {shape}")
        check_values(f"array '{name}'", value, max_abs)
        out.append(value)
    return tuple(out)


# the same global model reaches every client a worker serves in a round as one bytes object: checked once
_VALIDATED: PayloadMemo[tuple[np.ndarray, ...]] = PayloadMemo()


def printable(text: str, limit: int = 300) -> str:
    """At most `limit` characters of received text, every unprintable one shown as '?' (safe to log)."""
    return "".join(ch if ch.isprintable() else "?" for ch in text[:limit])


def decode_npy(data: bytes) -> np.ndarray:
    """An array serialized in numpy's .npy format, read in place: a read-only view of `data`, no copy. Object
    dtypes (which would need pickle) and truncated data are refused with a ValueError."""
    stream = io.BytesIO(data)
    version = npy_format.read_magic(stream)
    if version == (1, 0):
        shape, fortran, dtype = npy_format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, fortran, dtype = npy_format.read_array_header_2_0(stream)
    else:
        raise ValueError(f"unsupported .npy version {version}")
    if dtype.hasobject:
        raise ValueError("object arrays are refused (they would need pickle)")
    count = int(np.prod(shape, dtype=np.int64))
    offset = stream.tell()
    if len(data) - offset != count * dtype.itemsize:
        raise ValueError(f"{len(data) - offset} data bytes for {count} values of {dtype}")
    values = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return values.reshape(shape, order="F" if fortran else "C")


def check_values(label: str, values: np.ndarray, max_abs: float) -> None:
    """Finite and at most `max_abs` in magnitude, else PayloadError naming `label`."""
    if values.size:  # min and max: two passes without temporaries; a NaN or Inf makes one of them non-finite
        low, high = float(values.min()), float(values.max())
        if not (np.isfinite(low) and np.isfinite(high)):
            raise PayloadError(f"{label} has NaN or Inf values")
        if max(-low, high) > max_abs:
            raise PayloadError(f"{label} has values above {max_abs:g} in magnitude")


def record_to_numpy(arrays: Mapping[str, Any] | None, max_arrays: int = 10_000) -> dict[str, np.ndarray]:
    """Decode every array of a received record (numpy serialization only, pickling disabled)."""
    if arrays is None:
        raise PayloadError("missing 'arrays' record")
    if len(arrays) > max_arrays:
        raise PayloadError(f"record holds {len(arrays)} arrays, more than {max_arrays}")
    out = {}
    for name, item in arrays.items():
        if getattr(item, "stype", None) != "numpy.ndarray":
            raise PayloadError(f"array '{name}' has serialization {getattr(item, 'stype', None)!r}, not numpy")
        try:
            out[name] = decode_npy(item.data)
        except Exception as exc:
            raise PayloadError(f"array '{name}' does not decode: {exc}") from None
    return out


def _metric(metrics: Mapping[str, Any] | None, key: str) -> float:
    """A metric that must be present and a plain number (bools and strings are refused)."""
    if metrics is None or key not in metrics:
        raise PayloadError(f"missing metric '{key}'")
    value = metrics[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PayloadError(f"metric '{key}' = {value!r} is not a number")
    return value


def read_count(metrics: Mapping[str, Any] | None, key: str, allow_zero: bool = False) -> int:
    """A non-negative (or positive) whole-number metric such as num-examples."""
    value = _metric(metrics, key)
    if not np.isfinite(value) or value != int(value):
        raise PayloadError(f"metric '{key}' = {value!r} is not a whole number")
    if value < 0 or (value == 0 and not allow_zero) or value > 10**9:
        raise PayloadError(f"metric '{key}' = {value!r} is out of range")
    return int(value)


def read_fraction(metrics: Mapping[str, Any] | None, key: str) -> float:
    """A metric that must lie in [0, 1] (accuracies)."""
    value = _metric(metrics, key)
    if not 0.0 <= float(value) <= 1.0:
        raise PayloadError(f"metric '{key}' = {value!r} is not in [0, 1]")
    return float(value)


def read_finite(metrics: Mapping[str, Any] | None, key: str) -> float:
    """A finite float metric (losses)."""
    value = _metric(metrics, key)
    if not np.isfinite(value):
        raise PayloadError(f"metric '{key}' = {value!r} is not a finite number")
    return float(value)


ECHO_KEYS = (SERVER_ROUND, PHASE)  # instruction values every reply names back


def echo_values(config: Mapping[str, Any]) -> dict[str, int]:
    """What a reply must name back of its instructions: the round, and the phase where the algorithm has phases."""
    return {key: int(config[key]) for key in ECHO_KEYS if key in config}


def check_echo(metrics: Mapping[str, Any] | None, expected: Mapping[str, int]) -> None:
    """PayloadError unless the reply names the round (and phase) of the message it answers."""
    for key, value in expected.items():
        got = metrics.get(key) if metrics is not None else None
        if type(got) is not int or got != value:
            raise PayloadError(f"it answers {key} {got!r}, but the message sent was for {key} {value}")
