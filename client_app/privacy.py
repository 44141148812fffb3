"""Local differential privacy of a client's upload (run-config `dp` = local): the update against the arrays the
client received is clipped to `dp-clip-norm` and noised with std `dp-noise-multiplier * dp-clip-norm` on what it
sends, before the reply leaves the device. The noise is secret from the server: drawn from the operating system,
unless a study fixes `dp-noise-seed` (then from it, the partition and the round)."""

from __future__ import annotations

import numpy as np
from flwr.app import RecordDict

from common.methods.privacy import local_dp_update
from common.sections import PrivacySettings
from common.wire.messages import ARRAYS
from common.wire.records import to_record
from common.wire.validation import record_to_numpy


def noise_generator(settings: PrivacySettings, partition_id: int, server_round: int) -> np.random.Generator:
    """The generator of this upload's noise: the OS's entropy, or (dp-noise-seed, partition, round) for a study."""
    if settings.dp_noise_seed:
        return np.random.default_rng([settings.dp_noise_seed, partition_id, server_round, 0x6C6F63])
    return np.random.default_rng()


def private_reply(
    settings: PrivacySettings, content: RecordDict, reply: RecordDict, partition_id: int, server_round: int
) -> RecordDict:
    """The training reply with its upload clipped and noised under `dp` = local (unchanged otherwise). Every array
    it uploads must be one it received (its update is what DP bounds); ValueError otherwise, and the client sends
    nothing rather than an array without noise."""
    if settings.dp != "local" or ARRAYS not in reply.array_records:
        return reply
    sent = record_to_numpy(reply.array_records[ARRAYS])
    received = record_to_numpy(content.array_records[ARRAYS]) if ARRAYS in content.array_records else {}
    unmatched = [k for k, v in sent.items() if k not in received or received[k].shape != v.shape]
    if unmatched:
        raise ValueError(
            f"local DP: the upload carries {unmatched[:3]}, which the server did not send: no update to bound"
        )
    names = list(sent)
    base = [received[k].astype(np.float64) for k in names]
    update = [sent[k].astype(np.float64) - b for k, b in zip(names, base)]
    rng = noise_generator(settings, partition_id, server_round)
    noised = local_dp_update(update, [None] * len(names), settings.dp_clip_norm, settings.dp_noise_multiplier, rng)
    reply[ARRAYS] = to_record(names, [(b + u).astype(np.float32) for b, u in zip(base, noised)])
    return reply
