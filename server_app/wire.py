"""Bytes on the wire: the size of a Message as Flower serializes it for transport, and a digest of what it carries.

Flower sends a message as a tree of content-addressed objects (the message with its metadata, its record dict,
records, arrays and array chunks of at most 5 MiB), each the bytes its `deflate()` returns, each distinct object
once. `wire_bytes` sums exactly those sizes, but from lengths: an object's header holds its children's ids, which are
sha256 hex strings of fixed length, so no array data is copied or hashed; distinct objects are told apart by
comparing their contents (chunks of equal length byte by byte, which stops at the first difference). A test checks
the count against the sum over Flower's own deflated objects.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.app.message.array import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
from flwr.common.serde_utils import error_to_proto, metadata_to_proto
from flwr.proto.message_pb2 import Message as ProtoMessage  # pylint: disable=no-name-in-module
from flwr.supercore.constant import HEAD_BODY_DIVIDER, HEAD_VALUE_DIVIDER

from common.wire.messages import CONFIG, EXPECT_STATE, METRICS, SECAGG, STATE_ROUND

ID_LENGTH = 64  # an object id: sha256 in hex
PLACEHOLDER_ID = "0" * ID_LENGTH  # stands for a child's id where only its length matters


def object_size(kind: str, children: int, body: int) -> int:
    """Deflated size of an object of class `kind` with `children` distinct children and a `body`-byte body."""
    ids = children * ID_LENGTH + max(children - 1, 0)
    head = len(kind) + 2 * len(HEAD_VALUE_DIVIDER) + ids + len(str(body))
    return head + len(HEAD_BODY_DIVIDER) + body


class _Objects:
    """The distinct objects of one message tree, each counted once, found by content without hashing."""

    def __init__(self) -> None:
        self.total = 0
        self._chunks: dict[int, list[memoryview]] = {}  # length -> the distinct chunk contents of that length
        self._seen: set[tuple[Any, ...]] = set()

    def add(self, key: tuple[Any, ...], size: int) -> tuple[Any, ...]:
        """Count an object of this identity unless it was counted already; returns the identity."""
        if key not in self._seen:
            self._seen.add(key)
            self.total += size
        return key

    def chunk(self, data: memoryview) -> tuple[Any, ...]:
        """An array chunk: counted once per distinct content."""
        same = self._chunks.setdefault(len(data), [])
        for index, other in enumerate(same):
            if _equal(other, data):
                return ("ArrayChunk", len(data), index)
        same.append(data)
        return self.add(("ArrayChunk", len(data), len(same) - 1), object_size("ArrayChunk", 0, len(data)))

    def array(self, array: Any) -> tuple[Any, ...]:
        """An Array and its chunks (Flower slices the serialized data in pieces of at most 5 MiB)."""
        view = memoryview(array.data)
        chunks = [
            self.chunk(view[start : start + FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE])
            for start in range(0, len(view), FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE)
        ]
        unique = list(dict.fromkeys(chunks))
        body = json.dumps(
            {
                "dtype": array.dtype,
                "shape": array.shape,
                "stype": array.stype,
                "arraychunk_ids": [unique.index(c) for c in chunks],
            }
        )
        key = ("Array", array.dtype, tuple(array.shape), array.stype, tuple(chunks))
        return self.add(key, object_size("Array", len(unique), len(body.encode("utf-8"))))

    def record(self, record: Any) -> tuple[Any, ...]:
        """A record: an ArrayRecord (its arrays by name), a MetricRecord or a ConfigRecord (deflated: small)."""
        if isinstance(record, ArrayRecord):
            refs = tuple((name, self.array(array)) for name, array in record.items())
            body = json.dumps({name: PLACEHOLDER_ID for name, _ in refs})
            children = len(dict.fromkeys(ref for _, ref in refs))
            return self.add(("ArrayRecord", refs), object_size("ArrayRecord", children, len(body.encode("utf-8"))))
        if isinstance(record, (MetricRecord, ConfigRecord)):
            deflated = record.deflate()
            return self.add((type(record).__name__, deflated), len(deflated))
        raise TypeError(f"cannot size a {type(record).__name__}")

    def record_dict(self, content: RecordDict) -> tuple[Any, ...]:
        """A RecordDict: its records by name."""
        refs = tuple((name, self.record(record)) for name, record in content.items())
        body = json.dumps({name: PLACEHOLDER_ID for name, _ in refs})
        children = len(dict.fromkeys(ref for _, ref in refs))
        return self.add(("RecordDict", refs), object_size("RecordDict", children, len(body.encode("utf-8"))))

    def message(self, message: Message) -> None:
        """A Message: its metadata (the message id left out, as Flower does), its error or its content."""
        metadata = metadata_to_proto(message.metadata)
        metadata.message_id = ""
        body = ProtoMessage(
            metadata=metadata, content=None, error=error_to_proto(message.error) if message.has_error() else None
        )
        children = 0
        if message.has_content():
            self.record_dict(message.content)
            children = 1
        self.add(("Message",), object_size("Message", children, len(body.SerializeToString(deterministic=True))))


def _equal(a: memoryview, b: memoryview) -> bool:
    """Equal contents; a memoryview comparison stops at the first difference, a full match is checked on bytes
    (a memoryview comparison of equal data goes element by element: ten times slower)."""
    if a[:4096] != b[:4096]:
        return False
    return bytes(a) == bytes(b)


def wire_bytes(message: Message | RecordDict) -> int:
    """Serialized size of a message (or of its content): every distinct object Flower pushes for it, each the length
    of its deflate()."""
    objects = _Objects()
    if isinstance(message, Message):
        objects.message(message)
    else:
        objects.record_dict(message)
    return objects.total


def count_wire_bytes(messages: Iterable[Message | RecordDict]) -> list[int]:
    """wire_bytes of each message."""
    return [wire_bytes(message) for message in messages]


def release_chunks(message: Message | RecordDict) -> None:
    """Drop the chunk cache Flower keeps on each array once it has sliced it (for an object id): not part of the
    message, but Ray would pickle it with it (twice the bytes, and chunks held as memory views pickle ~25x slower
    than the array)."""
    if isinstance(message, Message) and not message.has_content():
        return
    content = message if isinstance(message, RecordDict) else message.content
    for record in content.array_records.values():
        for array in record.values():
            array.__dict__.pop("_chunks", None)


def content_digest(message: Message) -> str:
    """What a message carries, as one hash: its content's object id (Flower's sha256 over the serialized records,
    arrays and chunks), or for an error reply its error code (its reason names the runtime's processes: Ray's actor
    and pid differ from run to run). Metadata (ids, times) is left out: two runs that send the same things give the
    same digests. So are the client-state versions a message names (expect-state, state-round): they
    say where a client keeps its state (a state folder reports them, memory does not), not what is learned, and a
    behaviour hash (experiments/studies/behaviour.py) pins what is learned. So is SecAgg+'s own record (public
    keys, encrypted shares, masked vectors): random by design, from the operating system, so two runs of one seed
    never send the same; what the masked vectors sum to is pinned by the model the next message carries."""
    if not message.has_content():
        return f"error:{message.error.code}"
    content = message.content
    if SECAGG in content:
        content = RecordDict({key: record for key, record in content.items() if key != SECAGG})
    config = content.config_records.get(CONFIG)
    metrics = content.metric_records.get(METRICS)
    expected = config.pop(EXPECT_STATE) if config is not None and EXPECT_STATE in config else None
    reported = metrics.pop(STATE_ROUND) if metrics is not None and STATE_ROUND in metrics else None
    try:
        digest = str(content.object_id)
    finally:
        if config is not None and expected is not None:
            config[EXPECT_STATE] = expected
        if metrics is not None and reported is not None:
            metrics[STATE_ROUND] = reported
    release_chunks(message)
    return digest
