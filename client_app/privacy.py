"""Local differential privacy of a client's upload (run-config `dp` = local): the update against the arrays the
client received is clipped to `dp-clip-norm` and noised with std `dp-noise-multiplier * dp-clip-norm` on what it
sends, before the reply leaves the device. The noise is secret from the server: drawn from the operating system,
unless a study fixes `dp-noise-seed` (then from it, the partition and the round). Under `dp-local-metrics` =
withhold the replies carry no statistic of the client's data besides the noised upload (`withheld_train_metrics`,
and no evaluation): the epsilon covers the uploads alone."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from flwr.app import MetricRecord, RecordDict

from common.methods.privacy import local_dp_update
from common.sections import PrivacySettings
from common.wire.messages import ARRAYS, METRICS, NUM_EXAMPLES, STEPS, TRAIN_FLOPS, TRAIN_LOSS
from common.wire.records import to_record
from common.wire.validation import record_to_numpy


def below_floor(settings: PrivacySettings, floor: object) -> str | None:
    """Why a device whose node config sets `dp-noise-floor` (the least local-DP noise multiplier it accepts) must
    not take part in this run; None when the run meets it (or no floor is set). The run config comes from whoever
    starts the run, so the device checks it itself: local DP, at least its z, and a noise seed the server does not
    know (a fixed dp-noise-seed lets anyone who knows it draw the noise again and subtract it)."""
    if floor is None:
        return None
    try:
        least = float(floor) if isinstance(floor, (int, float, str)) and not isinstance(floor, bool) else math.nan
    except ValueError:
        least = math.nan
    if not 0 <= least < math.inf:
        return f"node config 'dp-noise-floor' must be a finite number >= 0, got {floor!r}"
    if least == 0:
        return None
    if settings.dp != "local":
        return (
            f"this device takes part only under local DP (its dp-noise-floor is {least:g}); the run has dp = "
            f"{settings.dp!r}"
        )
    if settings.dp_noise_multiplier < least:
        return (
            f"the run's dp-noise-multiplier {settings.dp_noise_multiplier:g} is below this device's dp-noise-floor "
            f"{least:g}"
        )
    if settings.dp_noise_seed:
        return "the run fixes dp-noise-seed, so its noise could be drawn again: this device's dp-noise-floor needs 0"
    if not settings.withholds_metrics:
        return (
            "the run asks for dp-local-metrics = report (loss, counts and accuracies without noise, outside the "
            "epsilon): this device's dp-noise-floor needs withhold"
        )
    return None


# What a training reply says of a client's data under dp-local-metrics = withhold: fixed values, the same for every
# client (one example, so every weighted average is uniform; no loss, steps or FLOPs).
WITHHELD_TRAIN_METRICS = {NUM_EXAMPLES: 1, TRAIN_LOSS: 0.0, STEPS: 0, TRAIN_FLOPS: 0.0}
# What a handshake declares instead of the client's training and test counts.
WITHHELD_COUNT = 1


def withheld_train_metrics(settings: PrivacySettings, reply: RecordDict) -> RecordDict:
    """The training reply with its metrics replaced by WITHHELD_TRAIN_METRICS under dp-local-metrics = withhold
    (unchanged otherwise): the loss, sample and step counts and FLOPs are functions of the client's data that the
    upload's epsilon does not cover."""
    if settings.withholds_metrics and METRICS in reply.metric_records:
        reply[METRICS] = MetricRecord(dict(WITHHELD_TRAIN_METRICS))
    return reply


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
    noised = private_weights(settings, received, sent, dict.fromkeys(names), partition_id, server_round)
    reply[ARRAYS] = to_record(names, [noised[k] for k in names])
    return reply


def private_weights(
    settings: PrivacySettings,
    reference: Mapping[str, np.ndarray],
    weights: Mapping[str, np.ndarray],
    supports: Mapping[str, np.ndarray | None],
    partition_id: int,
    server_round: int,
) -> dict[str, np.ndarray]:
    """The weights to upload under `dp` = local: reference + the update (weights - reference) clipped to
    `dp-clip-norm` over the positions each array sends (`supports`: a bool mask, None for every position) and noised
    there only, float32; positions off the support keep their weights (they do not travel)."""
    names = list(supports)
    base = [np.asarray(reference[k], np.float64) for k in names]
    update = [np.asarray(weights[k], np.float64) - b for k, b in zip(names, base)]
    rng = noise_generator(settings, partition_id, server_round)
    masks = [supports[k] for k in names]
    noised = local_dp_update(update, masks, settings.dp_clip_norm, settings.dp_noise_multiplier, rng)
    out = dict(weights)
    for k, b, u, m in zip(names, base, noised, masks):
        out[k] = (b + u).astype(np.float32) if m is None else np.where(m, b + u, weights[k]).astype(np.float32)
    return out
