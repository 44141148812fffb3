"""Wire bytes: counted from Flower's serialized objects; payload-proportional; the cache changes nothing."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from server_app.wire import count_wire_bytes, wire_bytes


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


def test_counting_many_messages_gives_each_its_own_count_and_leaves_no_chunks_behind() -> None:
    import pickle

    shared = _content(300_000)
    own = _content(1_000, seed=1)
    messages = [shared, RecordDict({"arrays": shared.array_records["arrays"]}), own]
    expected = [wire_bytes(_content(300_000)), wire_bytes(RecordDict({"arrays": _content(300_000)["arrays"]})),
                wire_bytes(_content(1_000, seed=1))]
    assert count_wire_bytes(messages, {}) == expected
    for record in (shared.array_records["arrays"], own.array_records["arrays"]):
        assert all("_chunks" not in array.__dict__ for array in record.values())
    # a counted message pickles at its payload's size (Flower's cached chunks would double it)
    assert len(pickle.dumps(shared)) < 1.1 * 4 * 300_000


def test_the_count_is_the_sum_over_flowers_own_object_tree() -> None:
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    shared = _content(2_000_000)["arrays"]  # two chunks
    messages = [RecordDict({"arrays": shared, "config": ConfigRecord({"server-round": r})}) for r in (1, 2)]
    messages.append(RecordDict({"a": ArrayRecord({"x": _arr(np.ones(10, np.float32)),
                                                  "y": _arr(np.ones(10, np.float32))}), "b": shared}))
    cache: dict = {}
    for message in messages:
        expected = sum(len(obj.deflate()) for obj in get_all_nested_objects(message).values())
        assert wire_bytes(message, cache) == expected == wire_bytes(message)


def test_chunk_sizes_are_flowers_deflated_sizes_for_every_dtype_and_length() -> None:
    from flwr.app import Array, RecordDict
    from flwr.app.message.array import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    from server_app.wire import chunk_size

    limit = FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
    arrays = {"empty": np.zeros(0, np.float32), "bits": np.packbits(np.arange(1001) % 3 == 0),
              "ints": np.arange(12, dtype=np.int64).reshape(3, 4), "scalar": np.array(2.5, np.float32),
              "edge": np.zeros(limit, np.uint8), "over": np.ones(limit + 1, np.uint8),
              "float16": np.linspace(-1, 1, 777).astype(np.float16)}
    record = ArrayRecord({name: Array(value) for name, value in arrays.items()})
    for array in record.values():
        for _, chunk in array.slice_array():
            assert chunk_size(chunk) == len(chunk.deflate())
    message = RecordDict({"arrays": record, "config": ConfigRecord({"k": 1})})
    expected = sum(len(obj.deflate()) for obj in get_all_nested_objects(message).values())
    assert wire_bytes(message) == expected == wire_bytes(message, {})
