"""Results of pure functions of a received payload, remembered per process by the identity of its large bytes
(and the content of its small ones).

The in-process engine hands every client of a round that a worker serves the same bytes object for the same large
payload (the global model's arrays), so a worker validates and decodes it once, not once per client. A result is
kept with the bytes it came from, so their ids cannot be reused while it is kept; a payload whose data is not
immutable bytes, or whose large arrays another engine rebuilt per message, is computed every time."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# Payloads this small are told apart by their content, larger ones by identity: the in-process engine moves small
# arrays (a layer's biases, a small mask) through the pipe, as new bytes objects in every message; hashing them costs
# little, while hashing a model would cost more than the work a hit saves.
BY_CONTENT_BELOW = 1 << 16


class PayloadMemo(Generic[T]):
    """The last `size` results of one pure function of an ArrayRecord (and hashable parameters)."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self._entries: dict[tuple[Any, ...], tuple[list[bytes], T]] = {}

    @staticmethod
    def key(record: Mapping[str, Any], params: Hashable) -> tuple[Any, ...] | None:
        """The parameters, and every array's name, declared form and bytes (their identity, or their content when
        small; None: not all bytes)."""
        parts: list[Any] = [params]
        for name, item in record.items():
            data = getattr(item, "data", None)
            if type(data) is not bytes:
                return None
            form = (getattr(item, "stype", None), getattr(item, "dtype", None), repr(getattr(item, "shape", None)))
            parts.append((name, form, data if len(data) < BY_CONTENT_BELOW else id(data)))
        return tuple(parts)

    def get(self, record: Mapping[str, Any], params: Hashable, compute: Callable[[], T]) -> T:
        """compute()'s result for this payload and these parameters: remembered, or computed now (an exception
        propagates and nothing is remembered)."""
        key = self.key(record, params)
        if key is None:
            return compute()
        hit = self._entries.get(key)
        if hit is not None:
            return hit[1]
        value = compute()
        if len(self._entries) >= self.size:
            del self._entries[next(iter(self._entries))]
        self._entries[key] = ([item.data for item in record.values()], value)
        return value
