"""Wire bytes: counted from Flower's serialized objects; payload-proportional; the cache changes nothing."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from server_app.wire import wire_bytes


def _content(n: int, seed: int = 0) -> RecordDict:
    values = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    return RecordDict({"arrays": ArrayRecord({"w": _arr(values)}), "config": ConfigRecord({"server-round": 1})})


def _arr(values: np.ndarray):
    from flwr.app import Array

    return Array(values)


def test_bytes_track_the_payload() -> None:
    small, large = wire_bytes(_content(1_000)), wire_bytes(_content(2_000_000))
    assert 4_000 < small < 4_000 + 2_000
    assert 8_000_000 < large < 8_000_000 + 4_000  # chunked in 5 MiB pieces: two chunk objects
    assert wire_bytes(RecordDict({"config": ConfigRecord({"server-round": 1})})) < 500


def test_cache_does_not_change_the_count() -> None:
    content = _content(10_000)
    cache: dict[str, int] = {}
    first = wire_bytes(content, cache)
    assert cache and wire_bytes(content, cache) == first == wire_bytes(content)


def test_identical_chunks_are_sent_once() -> None:
    # Flower addresses objects by content: a message holding two equal arrays pushes the data once
    twice = RecordDict({"arrays": ArrayRecord({"a": _arr(np.ones(50_000, np.float32)),
                                               "b": _arr(np.ones(50_000, np.float32))})})
    assert wire_bytes(twice) < 200_000 + 2_000
