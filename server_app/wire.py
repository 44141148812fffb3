"""Bytes on the wire: the size of a Message as Flower serializes it for transport."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import Message, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, no_object_id_recompute


def wire_bytes(message: Message | RecordDict, cache: dict[str, int] | None = None) -> int:
    """Serialized size of a message (or of its content): every object Flower pushes for it.

    Flower sends a message as a tree of content-addressed objects (the message with its metadata,
    records, arrays, array chunks), each the bytes its `deflate()` returns; this sums exactly those.
    `cache` (object id -> size) saves re-serializing objects shared by several messages of a round; it
    does not change the count: each message is charged for every object it carries.
    """
    total = 0
    for object_id, obj in get_all_nested_objects(message).items():
        size = cache.get(object_id) if cache is not None else None
        if size is None:
            size = len(obj.deflate())
            if cache is not None:
                cache[object_id] = size
        total += size
    return total


def count_wire_bytes(messages: Iterable[Message | RecordDict], cache: dict[str, int] | None = None) -> list[int]:
    """wire_bytes of each message, with every object's id computed once for them all (an array shared by many
    messages is hashed once, not once a message), then the array chunks Flower cached on them while counting
    released: they are not part of the message, but Ray would pickle them with it (twice the bytes, and chunks
    held as memory views pickle ~25x slower than the array)."""
    messages = list(messages)
    with no_object_id_recompute():
        sizes = [wire_bytes(message, cache) for message in messages]
    for message in messages:
        release_chunks(message)
    return sizes


def release_chunks(message: Message | RecordDict) -> None:
    """Drop the chunk cache Flower keeps on each array of a message (rebuilt by Flower when it needs it)."""
    content = message if isinstance(message, RecordDict) else message.content
    for record in content.array_records.values():
        for array in record.values():
            array.__dict__.pop("_chunks", None)
