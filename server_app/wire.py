"""Bytes on the wire: the size of a Message as Flower serializes it for transport."""

from __future__ import annotations

from flwr.app import Message, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects


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
