"""Bytes on the wire: the size of a Message as Flower serializes it for transport, and a digest of what it carries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flwr.app import Array, ArrayRecord, Message, RecordDict
from flwr.supercore.constant import HEAD_BODY_DIVIDER, HEAD_VALUE_DIVIDER

SizeCache = dict[str, dict[str, int]]  # an array record's object id -> {object id: size} of it and all under it


def chunk_size(chunk: Any) -> int:
    """Deflated size of an ArrayChunk (Flower's header, the divider, the data) without building it: the data is
    up to 5 MiB, and deflating copies it twice."""
    header = f"{type(chunk).__qualname__}{HEAD_VALUE_DIVIDER}{HEAD_VALUE_DIVIDER}{len(chunk.data)}"
    return len(header.encode("utf-8")) + len(HEAD_BODY_DIVIDER) + memoryview(chunk.data).nbytes


def _objects(obj: Any, cache: SizeCache | None) -> dict[str, int]:
    """Object id -> deflated size, for `obj` and every object under it (each distinct object once)."""
    object_id = obj.object_id  # Flower keeps it on an unchanged record: no re-hashing of a shared model
    if cache is not None and isinstance(obj, ArrayRecord) and object_id in cache:
        return cache[object_id]
    found: dict[str, int] = {}
    if isinstance(obj, Array):
        # the chunks' ids as Flower computed them when it sliced the array (an ArrayChunk re-hashes its data on
        # every object_id call, and each deflate copies it)
        for chunk_id, chunk in obj.slice_array():
            found[chunk_id] = chunk_size(chunk)
    else:
        for child in (obj.children or {}).values():
            found.update(_objects(child, cache))
    found[object_id] = len(obj.deflate())
    if cache is not None and isinstance(obj, ArrayRecord):
        cache[object_id] = found
    return found


def wire_bytes(message: Message | RecordDict, cache: SizeCache | None = None) -> int:
    """Serialized size of a message (or of its content): every object Flower pushes for it.

    Flower sends a message as a tree of content-addressed objects (the message with its metadata,
    records, arrays, array chunks), each the bytes its `deflate()` returns, each distinct object once;
    this sums exactly those. `cache` keeps the objects under each array record, so a model shared by
    many messages of a round is walked (and its chunks hashed) once; it does not change the count:
    each message is charged for every object it carries.
    """
    return sum(_objects(message, cache).values())


def count_wire_bytes(messages: Iterable[Message | RecordDict], cache: SizeCache | None = None) -> list[int]:
    """wire_bytes of each message, then the array chunks Flower cached on them while counting released: they are
    not part of the message, but Ray would pickle them with it (twice the bytes, and chunks held as memory views
    pickle ~25x slower than the array)."""
    sizes = []
    for message in messages:
        sizes.append(wire_bytes(message, cache))
        release_chunks(message)
    return sizes


def release_chunks(message: Message | RecordDict) -> None:
    """Drop the chunk cache Flower keeps on each array of a message (rebuilt by Flower when it needs it)."""
    content = message if isinstance(message, RecordDict) else message.content
    for record in content.array_records.values():
        for array in record.values():
            array.__dict__.pop("_chunks", None)


def content_digest(message: Message) -> str:
    """What a message carries, as one hash: its content's object id (Flower's sha256 over the serialized records,
    arrays and chunks; computed once and kept while the content is unchanged), or for an error reply its error code
    (its reason names the runtime's processes: Ray's actor and pid differ from run to run). Metadata (ids,
    times) is left out: two runs that send the same things give the same digests."""
    if message.has_content():
        return str(message.content.object_id)
    return f"error:{message.error.code}"
