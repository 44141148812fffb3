"""The one place the in-process engine writes Flower's private message fields: a SuperLink stamps each message with
its id, run and source node, and Flower's Message API has no public setter for them. tests/test_engine.py pins the
fields this relies on, so a Flower release that renames them fails there, not mid-run."""

from __future__ import annotations

from flwr.app import Message

PRIVATE_FIELDS = ("_message_id", "_run_id", "_src_node_id")  # Metadata's attributes behind its read-only properties


def stamp(message: Message, message_id: str, run_id: int | None = None, src_node_id: int | None = None) -> Message:
    """Give `message` the id (and run and source node, where given) a SuperLink would; returns it."""
    fields = message.metadata.__dict__
    fields[PRIVATE_FIELDS[0]] = message_id
    if run_id is not None:
        fields[PRIVATE_FIELDS[1]] = run_id
    if src_node_id is not None:
        fields[PRIVATE_FIELDS[2]] = src_node_id
    return message
