"""Message contents as they cross the pipe between the server process and a worker process: the records exactly as
Flower serializes them into a message (each array as its dtype, shape, serialization type and `.npy` bytes; metric
and config values as they are), in plain Python values and bytes, rebuilt into the same Flower records on the other
side. Rebuilt contents are identical to the originals: the same Flower object id (a hash over every record, array and
chunk), so the same bytes counted and the same digests. Only plain values cross, never a Flower object: the engine's
processes exchange what a SuperLink would forward, not live objects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from experiments.engine.blobs import SHARED_FROM_BYTES, BlobRef, take

ArrayItem = tuple[str, str, tuple[int, ...], str, "bytes | BlobRef"]  # key, dtype, shape, stype, data (or its block)
Records = list[tuple[str, str, Any]]  # (record name, kind: "arrays" | "metrics" | "config", its items), in order


def records_out(content: RecordDict, share: Callable[[bytes], BlobRef] | None = None) -> Records:
    """A record dict as plain values, in its order (the order is part of its serialized form); with `share`, array
    payloads of SHARED_FROM_BYTES or more are handed to it and travel as its block reference."""

    def data(payload: bytes) -> bytes | BlobRef:
        return share(payload) if share is not None and len(payload) >= SHARED_FROM_BYTES else payload

    out: Records = []
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            out.append(
                (name, "arrays", [(key, a.dtype, tuple(a.shape), a.stype, data(a.data)) for key, a in record.items()])
            )
        elif isinstance(record, MetricRecord):
            out.append((name, "metrics", dict(record)))
        elif isinstance(record, ConfigRecord):
            out.append((name, "config", dict(record)))
        else:
            raise TypeError(f"record {name!r} is a {type(record).__name__}, not a Flower record")
    return out


_RECENT: dict[str, bytes] = {}  # a worker's last few shared blocks (names are never reused): read once, not per message
RECENT_BLOCKS = 4


def _shared(ref: BlobRef) -> bytes:
    """A shared block's payload, read from shared memory on its first message in this process only (every client
    of a round gets the same global model: one read, one bytes object, per worker)."""
    if ref.name not in _RECENT:
        if len(_RECENT) >= RECENT_BLOCKS:
            del _RECENT[next(iter(_RECENT))]
        _RECENT[ref.name] = take(ref, unlink=False)
    return _RECENT[ref.name]


def records_in(items: Records, unlink: bool = False) -> RecordDict:
    """The record dict `records_out` gave these values for (payloads in shared memory copied out; `unlink`: and
    their blocks freed, by their only reader)."""

    def payload(data: bytes | BlobRef) -> bytes:
        if not isinstance(data, BlobRef):
            return data
        return take(data, unlink=True) if unlink else _shared(data)

    content = RecordDict()
    for name, kind, values in items:
        if kind == "arrays":
            content[name] = ArrayRecord(
                {
                    key: Array(dtype=dtype, shape=tuple(shape), stype=stype, data=payload(data))
                    for key, dtype, shape, stype, data in values
                }
            )
        elif kind == "metrics":
            content[name] = MetricRecord(values)
        elif kind == "config":
            content[name] = ConfigRecord(values)
        else:
            raise ValueError(f"record {name!r} has unknown kind {kind!r}")
    return content


def num_bytes(items: Records) -> int:
    """The array bytes the values hold (what dominates a message's size)."""
    return sum(
        item[4].size if isinstance(item[4], BlobRef) else len(item[4])
        for _, kind, values in items
        if kind == "arrays"
        for item in values
    )


def blob_refs(items: Records | None) -> list[BlobRef]:
    """The shared-memory blocks the values refer to."""
    return [
        item[4]
        for _, kind, values in items or []
        if kind == "arrays"
        for item in values
        if isinstance(item[4], BlobRef)
    ]
