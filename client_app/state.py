"""Client state kept across rounds (personal weights, algorithm state) in the SuperNode's context.state."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, RecordDict


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
