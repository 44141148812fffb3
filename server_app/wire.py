"""Bytes on the wire: the size of a Message as Flower serializes it for transport."""

from __future__ import annotations

from flwr.app import Message, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects


def content_wire_bytes(content: RecordDict) -> int:
    """Serialized size of a message's content: every object Flower pushes for it (records, arrays, chunks).

    Flower sends a message as its metadata plus a tree of content-addressed objects, each the bytes
    returned by `deflate()`; this sums exactly those byte strings.
    """
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(content).values())


def message_wire_bytes(message: Message) -> int:
    """Serialized size of a whole message: its content plus the message object (metadata) itself."""
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(message).values())
