"""The most a reply may hold, checked before any of it is decoded, re-serialized or counted: every record, entry,
key and value is counted against a bound, and the check stops at the first bound passed, so a reply built to cost
the server time (200,000 config entries, a 40 MB bytes value, megabyte-long keys) is refused in time bounded by
the limits, not by the reply's size."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
from flwr.app import RecordDict

from common.wire.messages import METRICS
from common.wire.validation import PayloadError, check_echo, printable


@dataclass(frozen=True)
class ReplyLimits:
    """The most a reply of this model may hold."""

    arrays: int  # arrays over all array records
    array_bytes: int  # their data bytes
    records: int = 4  # records of every kind
    metrics: int = 1_000  # metric values (a list counts its items)
    config_entries: int = 64  # config entries (a list counts its items)
    config_bytes: int = 1 << 16  # bytes of all config strings and bytes values
    key_chars: int = 128  # the longest record name, entry key, dtype or serialization name
    array_dims: int = 8  # the most dimensions an array's shape may have

    @classmethod
    def for_model(cls, specs: list[tuple[str, tuple[int, ...]]]) -> ReplyLimits:
        """Room for the whole model sent dense or sparse (4 arrays a tensor), twice over, plus framing."""
        values = sum(int(np.prod(shape)) for _, shape in specs)
        return cls(arrays=4 * len(specs) + 16, array_bytes=2 * 4 * values + (1 << 16))

    def check(self, content: RecordDict, expected: Mapping[str, int] | None = None) -> None:
        """PayloadError naming what is too large, or (with `expected`) a round or phase the reply does not name."""
        if len(content) > self.records:
            raise PayloadError(f"{len(content)} records, more than {self.records}")
        self._keys("record name", content.keys())
        arrays, metrics, configs = content.array_records, content.metric_records, content.config_records
        self._count("arrays", sum(len(r) for r in arrays.values()), self.arrays, " this model needs")
        self._count("metric entries", sum(len(r) for r in metrics.values()), self.metrics)
        self._count("config entries", sum(len(r) for r in configs.values()), self.config_entries)
        size = 0
        for record in arrays.values():
            self._keys("array key", record.keys())
            for array in record.values():
                self._keys("array dtype or serialization", (str(array.dtype), str(array.stype)))
                if len(array.shape) > self.array_dims:
                    raise PayloadError(f"an array of {len(array.shape)} dimensions, more than {self.array_dims}")
                size += len(array.data)
        if size > self.array_bytes:
            raise PayloadError(f"{size} bytes of arrays, more than the {self.array_bytes} this model needs")
        self._count("metric values", sum(_items(r.values(), self.metrics) for r in metrics.values()), self.metrics)
        entries = text = 0
        for config in configs.values():
            self._keys("config key", config.keys())
            for value in config.values():
                values = value if isinstance(value, list) else [value]
                entries += len(values)
                self._count("config values", entries, self.config_entries)
                text += sum(len(v) for v in values if isinstance(v, (str, bytes)))
                self._count("bytes of config text", text, self.config_bytes)
        for metric in metrics.values():
            self._keys("metric key", metric.keys())
        check_echo(metrics.get(METRICS), expected or {})

    def _keys(self, what: str, keys: Iterable[str]) -> None:
        """PayloadError for a key longer than `key_chars` (its start shown, printable only)."""
        for key in keys:
            if len(key) > self.key_chars:
                shown = printable(key, 40)
                raise PayloadError(f"a {what} of {len(key)} characters ({shown!r}...), more than {self.key_chars}")

    @staticmethod
    def _count(what: str, count: int, bound: int, suffix: str = "") -> None:
        """PayloadError when `count` passes `bound`."""
        if count > bound:
            raise PayloadError(f"{count} {what}, more than the {bound}{suffix}")


def _items(values: Iterable[Any], bound: int) -> int:
    """Values counted with a list's items (stops past `bound`)."""
    total = 0
    for value in islice(values, bound + 1):
        total += len(value) if isinstance(value, list) else 1
        if total > bound:
            break
    return total
