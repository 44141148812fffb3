"""Client state kept across rounds (personal weights, algorithm state) in the SuperNode's context.state."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict


class ClientState:
    """Named lists of arrays stored in a Flower RecordDict that stays on the device."""

    def __init__(self, record: RecordDict) -> None:
        self.record = record

    def load_arrays(self, key: str) -> list[np.ndarray] | None:
        """The arrays saved under `key`, or None if never saved."""
        stored = self.record.array_records.get(key)
        return None if stored is None else stored.to_numpy_ndarrays()

    def save_arrays(self, key: str, arrays: list[np.ndarray]) -> None:
        """Replace the arrays saved under `key`."""
        self.record[key] = ArrayRecord([np.ascontiguousarray(a) for a in arrays])

    def load_named(self, key: str) -> dict[str, np.ndarray] | None:
        """The named arrays saved under `key`, or None if never saved."""
        stored = self.record.array_records.get(key)
        return None if stored is None else {name: array.numpy() for name, array in stored.items()}

    def save_named(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        """Replace the named arrays saved under `key` (any dtype: weights, bool masks, counters)."""
        self.record[key] = ArrayRecord({name: Array(np.ascontiguousarray(a)) for name, a in arrays.items()})
