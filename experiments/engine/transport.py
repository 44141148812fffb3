"""Messages as they travel: Flower's content-addressed objects (a message, its records, arrays and array chunks, each
the bytes its `deflate()` gives, as a SuperLink stores and forwards them), packed to cross a pipe to a worker
process and inflated on the other side. No pickle of Flower objects: only bytes and strings cross."""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import Message, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

from server_app.wire import release_chunks


@dataclass(frozen=True)
class Packed:
    """One object tree: the root's object id and every object's serialized bytes by id."""

    root: str
    objects: dict[str, bytes]

    @property
    def num_bytes(self) -> int:
        """The bytes of all its objects: what a SuperLink would move for it."""
        return sum(len(body) for body in self.objects.values())


def pack(obj: Message | RecordDict) -> Packed:
    """Serialize a message (or a record dict) into its objects, as Flower pushes them; the array chunks Flower
    caches on the arrays while slicing them are dropped afterwards (they are not part of the message)."""
    objects = {object_id: item.deflate() for object_id, item in get_all_nested_objects(obj).items()}
    packed = Packed(obj.object_id, objects)
    if not isinstance(obj, Message) or obj.has_content():
        release_chunks(obj)
    return packed


def unpack_message(packed: Packed, message_id: str) -> Message:
    """The message a Packed holds, with the id it was sent under (the id is not part of the serialized message)."""
    msg = inflate_object_from_contents(packed.root, dict(packed.objects))
    if not isinstance(msg, Message):
        raise TypeError(f"expected a Message, got {type(msg).__name__}")
    msg.metadata.__dict__["_message_id"] = message_id
    return msg


def unpack_record(packed: Packed) -> RecordDict:
    """The record dict a Packed holds."""
    record = inflate_object_from_contents(packed.root, dict(packed.objects))
    if not isinstance(record, RecordDict):
        raise TypeError(f"expected a RecordDict, got {type(record).__name__}")
    return record
