"""Wire bytes: the sum over Flower's own serialized object tree (each distinct object once), counted from lengths
without copying or hashing the data; payload-proportional; the digest of what a message carries."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.app.message.array import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from server_app.wire import count_wire_bytes, wire_bytes

LIMIT = FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE


def _content(n: int, seed: int = 0) -> RecordDict:
    values = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    return RecordDict({"arrays": ArrayRecord({"w": Array(values)}), "config": ConfigRecord({"server-round": 1})})


def _flower_count(obj: object) -> int:
    """What Flower pushes: every distinct object of the tree, each its deflate()."""
    return sum(len(item.deflate()) for item in get_all_nested_objects(obj).values())  # type: ignore[arg-type]


def test_bytes_track_the_payload() -> None:
    small, large = wire_bytes(_content(1_000)), wire_bytes(_content(2_000_000))
    assert 4_000 < small < 4_000 + 2_000
    assert 8_000_000 < large < 8_000_000 + 4_000  # chunked in 5 MiB pieces: two chunk objects
    assert wire_bytes(RecordDict({"config": ConfigRecord({"server-round": 1})})) < 500


def test_identical_chunks_are_sent_once() -> None:
    # Flower addresses objects by content: a message holding two equal arrays pushes the data once
    twice = RecordDict(
        {"arrays": ArrayRecord({"a": Array(np.ones(50_000, np.float32)), "b": Array(np.ones(50_000, np.float32))})}
    )
    assert wire_bytes(twice) < 200_000 + 2_000
    assert wire_bytes(twice) == _flower_count(twice)


def test_counting_many_messages_gives_each_its_own_count() -> None:
    shared = _content(300_000)
    own = _content(1_000, seed=1)
    messages = [shared, RecordDict({"arrays": shared.array_records["arrays"]}), own]
    assert count_wire_bytes(messages) == [_flower_count(m) for m in messages]


ODD_ARRAYS = {
    "empty": np.zeros(0, np.float32),
    "bits": np.packbits(np.arange(1001) % 3 == 0),
    "ints": np.arange(12, dtype=np.int64).reshape(3, 4),
    "scalar": np.array(2.5, np.float32),
    "edge": np.zeros(LIMIT, np.uint8),
    "over": np.ones(LIMIT + 1, np.uint8),
    "float16": np.linspace(-1, 1, 777).astype(np.float16),
    "repeated-chunks": np.zeros(3 * LIMIT + 7, np.uint8),  # three equal chunks and a short one: two distinct
    "prefix-equal": np.concatenate([np.zeros(LIMIT - 1, np.uint8), np.ones(1, np.uint8)]),  # differs at the end
    "same-as-edge": np.zeros(LIMIT, np.uint8),  # a second array equal to "edge": one object
}


@pytest.mark.parametrize("case", ["odd arrays", "shared records", "metrics and configs", "several records"])
def test_the_count_is_the_sum_over_flowers_own_object_tree(case: str) -> None:
    if case == "odd arrays":
        content = RecordDict(
            {"arrays": ArrayRecord({k: Array(v) for k, v in ODD_ARRAYS.items()}), "config": ConfigRecord({"k": 1})}
        )
    elif case == "shared records":
        shared = _content(2_000_000)["arrays"]  # two chunks
        content = RecordDict(
            {
                "a": shared,
                "b": shared,
                "c": ArrayRecord({"x": Array(np.ones(10, np.float32)), "y": Array(np.ones(10, np.float32))}),
            }
        )
    elif case == "metrics and configs":
        content = RecordDict(
            {
                "metrics": MetricRecord({"a": 1, "b": [1.5, 2.5], "é": 0.25}),
                "config": ConfigRecord({"s": "text", "flag": True, "raw": b"\x00\x01", "n": [1, 2]}),
                "same": ConfigRecord({"s": "text", "flag": True, "raw": b"\x00\x01", "n": [1, 2]}),
            }
        )
    else:
        content = RecordDict(
            {
                "w": ArrayRecord({"x": Array(np.arange(5, dtype=np.float32))}),
                "v": ArrayRecord({"x": Array(np.arange(5, dtype=np.float32))}),  # equal to "w"
                "m": MetricRecord({"loss": 0.5}),
            }
        )
    assert wire_bytes(content) == _flower_count(content)


def test_a_whole_message_is_counted_with_its_metadata_and_an_error_reply_too() -> None:
    from flwr.app import Error, Message
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("run_id", 7), ("node_id", 1), ("task_id", 1)):
        setattr(TaskIdentity, name, value)
    message = Message(_content(400_000), dst_node_id=123, message_type="train", group_id="5")
    message.metadata.__dict__["_message_id"] = "abc"
    assert wire_bytes(message) == _flower_count(message)
    error = Message(Error(code=2, reason="client failed"), reply_to=message)
    assert wire_bytes(error) == _flower_count(error)


def test_content_digest_is_flowers_content_id_and_ignores_metadata() -> None:
    from flwr.app import Error, Message
    from flwr.supercore.task_identity import TaskIdentity

    from server_app.wire import content_digest

    for name, value in (("run_id", 7), ("node_id", 1), ("task_id", 1)):
        setattr(TaskIdentity, name, value)
    first = Message(_content(1_000), dst_node_id=1, message_type="train")
    second = Message(_content(1_000), dst_node_id=2, message_type="train", group_id="9")
    other = Message(_content(1_000, seed=3), dst_node_id=1, message_type="train")
    assert content_digest(first) == content_digest(second) == first.content.object_id != content_digest(other)
    assert all("_chunks" not in a.__dict__ for a in first.content.array_records["arrays"].values())
    assert content_digest(Message(Error(code=2, reason="pid 1"), reply_to=first)) == "error:2"


def test_the_client_state_versions_a_message_names_are_not_in_its_digest() -> None:
    """expect-state and state-round say where a client keeps its state, not what it learned: a run with a state
    folder and one in memory send the same digests; the message keeps them."""
    from flwr.app import ConfigRecord, Message, MetricRecord
    from flwr.supercore.task_identity import TaskIdentity

    from server_app.wire import content_digest

    for name, value in (("run_id", 7), ("node_id", 1), ("task_id", 1)):
        setattr(TaskIdentity, name, value)
    plain, named = _content(100), _content(100)
    plain["config"], named["config"] = ConfigRecord({"server-round": 3}), ConfigRecord({"server-round": 3})
    plain["metrics"], named["metrics"] = MetricRecord({"loss": 1.0}), MetricRecord({"loss": 1.0})
    named["config"]["expect-state"] = 2
    named["metrics"]["state-round"] = 3
    message = Message(named, dst_node_id=1, message_type="train")
    assert content_digest(message) == content_digest(Message(plain, dst_node_id=1, message_type="train"))
    assert message.content["config"]["expect-state"] == 2 and message.content["metrics"]["state-round"] == 3
    named["config"]["server-round"] = 4
    assert content_digest(message) != content_digest(Message(plain, dst_node_id=1, message_type="train"))


def test_secaggs_own_record_is_not_in_a_digest_and_stays_in_the_message() -> None:
    """SecAgg+'s keys, shares and masked vectors are random in every run: two messages that differ only there have
    one digest; the model beside them still counts."""
    from flwr.app import ConfigRecord, Message
    from flwr.supercore.task_identity import TaskIdentity

    from common.wire.messages import SECAGG
    from server_app.wire import content_digest

    for name, value in (("run_id", 7), ("node_id", 1), ("task_id", 1)):
        setattr(TaskIdentity, name, value)
    keyed = [_content(100) for _ in range(3)]
    keyed[0][SECAGG], keyed[1][SECAGG] = ConfigRecord({"pk1": b"one"}), ConfigRecord({"pk1": b"two"})
    keyed[2] = _content(100, seed=4)
    keyed[2][SECAGG] = ConfigRecord({"pk1": b"one"})
    first, second, other = (Message(content, dst_node_id=1, message_type="train") for content in keyed)
    assert content_digest(first) == content_digest(second) != content_digest(other)
    assert content_digest(first) == content_digest(Message(_content(100), dst_node_id=1, message_type="train"))
    assert first.content[SECAGG]["pk1"] == b"one"
