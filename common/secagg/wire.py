"""SecAgg+'s stages as Flower records, read back with every field checked (types, lengths, sizes, ids): one module
for both halves, so what the server writes is what the client reads. A malformed record raises PayloadError."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from common.methods.distributed_dp import DP_UPDATE
from common.wire.codec import decode_sparse, from_arrays
from common.wire.messages import (
    SA_CIPHERTEXTS,
    SA_CLIENTS,
    SA_DROPPED,
    SA_IDS,
    SA_MASKED,
    SA_NAMES,
    SA_PK1,
    SA_PK2,
    SA_SHARES,
    SA_SIZES,
    SA_SURVIVORS,
    SA_THRESHOLD,
    SA_VALUES,
    SECAGG,
)
from common.wire.validation import PayloadError, record_to_numpy

from .encoding import Layout, Section
from .params import Cohort, SecAggParams
from .protocol import SecAggRefused

Fields = dict[str, Any]  # a record's fields (the glue makes the Flower record of them)

# The stages' message types (Flower's "<category>.<action>"); the masked vector rides on the plain train message.
SETUP, SHARE, UNMASK = "train.secagg_setup", "train.secagg_share", "train.secagg_unmask"
MAX_KEY_BYTES = 1024  # a PEM public key of SECP384R1 is 215 bytes
MAX_SECRET_BYTES = 4096  # a Fernet ciphertext of two shares (seed, PEM private key) is ~500 bytes; a share ~250
LOSS, CAPPED = "secagg/loss", "secagg/capped"


BESIDE = ":"  # between a record's key and an array's name in a layout name; no model array's name or codec form has it


def beside(record: str, name: str) -> str:
    """The layout's name of an array that travels in a reply's record other than the model's (SCAFFOLD's change of
    c_i): the record's key and the array's name."""
    return f"{record}{BESIDE}{name}"


def upload_arrays(records: Mapping[str, Any], names: Sequence[str], model: str) -> dict[str, np.ndarray]:
    """A reply's arrays as the upload's layout `names` them: the model record's under their own names, another
    record's under `beside` names; only the records the layout names are decoded."""
    out = record_to_numpy(records[model]) if model in records else {}
    wanted = {name.split(BESIDE, 1)[0] for name in names if BESIDE in name} - {model}
    for key in sorted(wanted & set(records)):
        out.update({beside(key, name): array for name, array in record_to_numpy(records[key]).items()})
    return out


def units_of(name: str) -> str:
    """The integer section of a masked array: each position's weight units (the client's units where its mask is
    set), the denominator of the masked average."""
    return f"{name}#units"


def votes_of(name: str) -> str:
    """The integer section of a masked array: 1 where the client's mask is set (the mask vote)."""
    return f"{name}#votes"


def upload_layout(
    names: Sequence[str], sizes: Sequence[int], masked: Sequence[str] = (), quantization_range: int = 1
) -> Layout:
    """The vector of an upload of named arrays: each array (weight-scaled; a masked one dense, 0 off the client's
    mask, with its units and votes sections), the training loss (weight-scaled) and whether the client's sample
    count was capped at max-weight."""
    sections: list[Section] = []
    for name, size in zip(names, sizes, strict=True):
        sections.append(Section(name, size))
        if name in masked:
            sections += [
                Section(units_of(name), size, "integer", quantization_range),
                Section(votes_of(name), size, "integer", 1),
            ]
    return Layout((*sections, Section(LOSS, 1), Section(CAPPED, 1, "integer", 1)))


def dp_layout(size: int) -> Layout:
    """Distributed DP's vector: the client's integer contribution over the round's arrays, concatenated in order
    (common/methods/distributed_dp.py). The weight coordinate counts each client once; no loss travels: it is a
    statistic of the client's data that the epsilon does not cover."""
    return Layout((Section(DP_UPDATE, size, "signed"),))


def upload_sections(
    arrays: Mapping[str, np.ndarray], names: Sequence[str], sizes: Sequence[int], masked: Sequence[str], units: int
) -> dict[str, np.ndarray]:
    """A client's own upload (plain arrays by name, or the codec's dense / sparse / values-only forms) as the
    sections `upload_layout` names; PayloadError when its form or sizes are not what the server's layout says."""
    out: dict[str, np.ndarray] = {}
    for name, size in zip(names, sizes, strict=True):
        if name in arrays:
            out[name] = np.asarray(arrays[name], np.float64).reshape(-1)
        elif f"{name}/dense" in arrays:
            out[name] = np.asarray(arrays[f"{name}/dense"], np.float64).reshape(-1)
        else:
            payload = from_arrays(name, arrays)
            if name in masked:
                if payload.bits is None:
                    raise PayloadError(f"the layout wants {name!r} on the client's own mask; the upload has no mask")
                dense, mask = decode_sparse(payload, tuple(int(d) for d in payload.shape))
                flat = mask.reshape(-1)
                out[name] = dense.astype(np.float64).reshape(-1)
                out[units_of(name)] = flat.astype(np.int64) * units
                out[votes_of(name)] = flat.astype(np.int64)
            else:
                out[name] = np.asarray(payload.values, np.float64).reshape(-1)
        if out[name].size != size:
            raise PayloadError(f"the upload's {name!r} has {out[name].size} values; the layout says {size}")
    return out


def _list(record: Mapping[str, Any], key: str, kind: type, limit: int = 1 << 20) -> list[Any]:
    value = record.get(key)
    if not isinstance(value, list) or any(type(v) is not kind for v in value):
        raise PayloadError(f"secagg field {key!r} is not a list of {kind.__name__}")
    if kind is bytes and any(len(v) > limit for v in value):
        raise PayloadError(f"secagg field {key!r} holds a value over {limit} bytes")
    if kind is int and any(not 0 <= v < 2**63 for v in value):
        raise PayloadError(f"secagg field {key!r} holds an id out of range")
    return value


def _table(record: Mapping[str, Any], ids: str, values: str, limit: int) -> dict[int, bytes]:
    keys, items = _list(record, ids, int), _list(record, values, bytes, limit)
    if len(keys) != len(items) or len(set(keys)) != len(keys):
        raise PayloadError(f"secagg fields {ids!r} and {values!r} do not pair up one to one")
    return dict(zip(keys, items, strict=True))


def _record(content_records: Mapping[str, Any]) -> Mapping[str, Any]:
    if SECAGG not in content_records:
        raise PayloadError(f"no {SECAGG!r} record")
    return content_records[SECAGG]


# ----- server -> client ----------------------------------------------------------------------------------------
def cohort_record(cohort: Cohort) -> Fields:
    """Stage 0's request: the round's cohort size, shares and threshold."""
    return {SA_CLIENTS: cohort.num_clients, SA_SHARES: cohort.shares, SA_THRESHOLD: cohort.threshold}


def read_cohort(records: Mapping[str, Any], params: SecAggParams) -> Cohort:
    """The cohort the server announced, which must be what the run's own parameters give for that many clients
    (a server lowering the threshold or the shares is refused)."""
    record = _record(records)
    size = record.get(SA_CLIENTS)
    if type(size) is not int or not 0 < size < 2**31:
        raise PayloadError("secagg field 'clients' is not a count")
    try:
        cohort = params.for_cohort(size)
    except ValueError as exc:
        raise SecAggRefused(f"the announced cohort of {size} clients: {exc}") from None
    if (record.get(SA_SHARES), record.get(SA_THRESHOLD)) != (cohort.shares, cohort.threshold):
        raise SecAggRefused(
            f"the server announced {record.get('shares')!r} shares and threshold {record.get('threshold')!r}; the "
            f"run's parameters give {cohort.shares} and {cohort.threshold}"
        )
    return cohort


def neighbours_record(keys: Mapping[int, tuple[bytes, bytes]]) -> Fields:
    """Stage 1's request: the neighbours' public keys."""
    return {
        SA_IDS: list(keys),
        SA_PK1: [pair[0] for pair in keys.values()],
        SA_PK2: [pair[1] for pair in keys.values()],
    }


def read_neighbours(records: Mapping[str, Any]) -> dict[int, tuple[bytes, bytes]]:
    """The neighbours' public keys of a stage 1 request."""
    record = _record(records)
    firsts, seconds = _table(record, SA_IDS, SA_PK1, MAX_KEY_BYTES), _table(record, SA_IDS, SA_PK2, MAX_KEY_BYTES)
    return {nid: (firsts[nid], seconds[nid]) for nid in firsts}


def routed_record(
    ciphertexts: Mapping[int, bytes], names: Sequence[str], sizes: Sequence[int], masked: Sequence[str]
) -> Fields:
    """Stage 2's addition to the train message: the shares addressed to the client, and the upload's layout."""
    return {
        SA_IDS: list(ciphertexts),
        SA_CIPHERTEXTS: list(ciphertexts.values()),
        SA_NAMES: list(names),
        SA_SIZES: list(sizes),
        SA_MASKED: list(masked),
    }


def read_routed(records: Mapping[str, Any]) -> tuple[dict[int, bytes], list[str], list[int], list[str]]:
    """The shares addressed to this client, and the names, sizes and masked names of its upload's layout."""
    record = _record(records)
    names, sizes, masked = _list(record, SA_NAMES, str), _list(record, SA_SIZES, int), _list(record, SA_MASKED, str)
    if len(names) != len(sizes) or len(set(names)) != len(names) or not set(masked) <= set(names):
        raise PayloadError("secagg fields 'names', 'sizes' and 'masked' do not pair up")
    return _table(record, SA_IDS, SA_CIPHERTEXTS, MAX_SECRET_BYTES), names, sizes, masked


def unmask_record(survivors: Sequence[int], dropped: Sequence[int]) -> Fields:
    """Stage 3's request: which neighbours' vectors are in the sum, which shared and then dropped."""
    return {SA_SURVIVORS: list(survivors), SA_DROPPED: list(dropped)}


def read_unmask(records: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """A stage 3 request (the client itself checks that it names no neighbour twice)."""
    record = _record(records)
    return _list(record, SA_SURVIVORS, int), _list(record, SA_DROPPED, int)


# ----- client -> server ----------------------------------------------------------------------------------------
def keys_record(pk1: bytes, pk2: bytes) -> Fields:
    """Stage 0's answer."""
    return {SA_PK1: pk1, SA_PK2: pk2}


def read_keys(records: Mapping[str, Any]) -> tuple[bytes, bytes]:
    """A client's two public keys."""
    record = _record(records)
    pair = record.get(SA_PK1), record.get(SA_PK2)
    if not all(isinstance(k, bytes) and 0 < len(k) <= MAX_KEY_BYTES for k in pair):
        raise PayloadError("secagg public keys missing or malformed")
    return pair  # type: ignore[return-value]


def secrets_record(table: Mapping[int, bytes]) -> Fields:
    """Stage 1's answer (ciphertexts by destination) and stage 3's (shares by owner)."""
    return {SA_IDS: list(table), SA_VALUES: list(table.values())}


def read_secrets(records: Mapping[str, Any]) -> dict[int, bytes]:
    """A stage 1 or stage 3 answer."""
    return _table(_record(records), SA_IDS, SA_VALUES, MAX_SECRET_BYTES)


def vector_dtype(modulus: int) -> np.dtype:
    """The masked vector's type on the wire: 4 bytes a value up to 2**32, else 8."""
    return np.dtype(np.uint32) if modulus <= 2**32 else np.dtype(np.uint64)


def vector_arrays(vector: np.ndarray, modulus: int) -> dict[str, np.ndarray]:
    """Stage 2's answer: the masked vector in its wire type (an array record of it: common.wire.records)."""
    return {SECAGG: np.ascontiguousarray(vector, dtype=vector_dtype(modulus))}


def read_vector(arrays: Mapping[str, Any], size: int, modulus: int) -> np.ndarray:
    """A masked vector as uint64: of the layout's size, the wire type of the modulus, every value below it."""
    record = arrays.get(SECAGG)
    if record is None or list(record) != [SECAGG]:
        raise PayloadError(f"no masked vector in a {SECAGG!r} array record")
    array = record[SECAGG]
    dtype = vector_dtype(modulus)
    if array.stype != "numpy.ndarray" or array.dtype != str(dtype) or tuple(array.shape) != (size,):
        raise PayloadError(f"the masked vector is not {size} values of {dtype}")
    if len(array.data) > size * dtype.itemsize + 256:
        raise PayloadError("the masked vector's data is larger than its shape")
    vector = np.asarray(record_to_numpy(record, 1)[SECAGG], dtype=np.uint64)
    if vector.shape != (size,) or (size and int(vector.max()) >= modulus):
        raise PayloadError("the masked vector holds values of the modulus or more")
    return vector
