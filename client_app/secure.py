"""The client's half of secure aggregation (run-config `secagg`, common/secagg/): SecAgg+'s stages as train
actions, the round's session kept in the node's Flower context between them (as Flower's own secaggplus_mod
keeps its state), and the train reply turned into the masked vector. Nothing of the client's upload, sample count
or loss leaves in the clear: the reply's metrics are the fixed withheld values."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from common.algorithms import SPECS
from common.config import RunConfig
from common.methods.distributed_dp import DP_UPDATE, client_contribution, noise_multiplier_for, plan_round
from common.secagg.encoding import encode, weight_units
from common.secagg.protocol import ClientSession, SecAggRefused
from common.secagg.wire import (
    CAPPED,
    LOSS,
    dp_layout,
    keys_record,
    read_cohort,
    read_neighbours,
    read_routed,
    read_unmask,
    secrets_record,
    upload_arrays,
    upload_layout,
    upload_sections,
    vector_arrays,
)
from common.wire.messages import ARRAYS, CONFIG, METRICS, NUM_EXAMPLES, SA_ROUND, SECAGG, SERVER_ROUND, TRAIN_LOSS
from common.wire.records import to_plain_record
from common.wire.validation import echo_values, read_count, read_finite, record_to_numpy

from .privacy import WITHHELD_TRAIN_METRICS

SESSION = "secagg-session"  # the context's record of the round's session (private keys: never sent)


def _round(msg: Message) -> int:
    return read_count(msg.content.config_records.get(CONFIG), SERVER_ROUND, allow_zero=True)


def _echo(msg: Message) -> MetricRecord:
    return MetricRecord(dict(echo_values(msg.content.config_records.get(CONFIG, ConfigRecord()))))


def _save(context: Context, session: ClientSession, server_round: int) -> None:
    context.state.config_records[SESSION] = ConfigRecord({**session.state(), SA_ROUND: server_round})


def _load(cfg: RunConfig, context: Context, server_round: int) -> ClientSession:
    stored = context.state.config_records.get(SESSION)
    if stored is None or stored.get(SA_ROUND) != server_round:
        raise SecAggRefused(f"no secure-aggregation session of round {server_round} on this node")
    clients = stored.get("clients")
    return ClientSession.restore(stored, cfg.secagg_params.for_cohort(int(clients)))  # type: ignore[arg-type]


def setup(cfg: RunConfig, msg: Message, context: Context, partition_id: int) -> RecordDict:
    """Stage 0: check the announced cohort against the run's parameters, make the round's keys, send the public
    ones."""
    cohort = read_cohort(msg.content.config_records, cfg.secagg_params)
    session = ClientSession(partition_id, cohort)
    pk1, pk2 = session.advertise()
    _save(context, session, _round(msg))
    return RecordDict({SECAGG: ConfigRecord(keys_record(pk1, pk2)), METRICS: _echo(msg)})


def share(cfg: RunConfig, msg: Message, context: Context) -> RecordDict:
    """Stage 1: the shares of this round's secrets, encrypted for each neighbour."""
    session = _load(cfg, context, _round(msg))
    ciphertexts = session.share_keys(read_neighbours(msg.content.config_records))
    _save(context, session, _round(msg))
    return RecordDict({SECAGG: ConfigRecord(secrets_record(ciphertexts)), METRICS: _echo(msg)})


def masked_reply(cfg: RunConfig, msg: Message, context: Context, reply: RecordDict) -> RecordDict:
    """Stage 2: the training reply's arrays, loss and sample count as one masked vector; the metrics withheld
    (the round echo kept)."""
    server_round = _round(msg)
    session = _load(cfg, context, server_round)
    routed, names, sizes, masked = read_routed(msg.content.config_records)
    metrics = reply.metric_records.get(METRICS)
    weight, loss = float(read_count(metrics, NUM_EXAMPLES, allow_zero=True)), read_finite(metrics, TRAIN_LOSS)
    params = cfg.secagg_params
    if SPECS[cfg.algorithm].equal_weights:  # its server's average counts each client once
        weight = params.max_weight
    arrays = upload_arrays(reply.array_records, names, ARRAYS)
    if cfg.dp == "distributed":
        received = record_to_numpy(msg.content.array_records.get(ARRAYS))
        vector = private_vector(cfg, session, received, upload_sections(arrays, names, sizes, (), 1), server_round)
    else:
        units, capped = weight_units(weight, params)
        values = upload_sections(arrays, names, sizes, masked, units)
        values.update({LOSS: np.array([loss]), CAPPED: np.array([int(capped)])})
        rng = np.random.default_rng([cfg.seed, session.node_id, server_round, 0x5EC])  # the quantization's rounding
        layout = upload_layout(names, sizes, masked, params.quantization_range)
        vector, _ = encode(layout, values, weight, params, rng)
    sealed = session.masked(routed, vector)
    _save(context, session, server_round)
    return withheld(msg, RecordDict({SECAGG: to_plain_record(vector_arrays(sealed, params.modulus_range))}))


def private_vector(
    cfg: RunConfig,
    session: ClientSession,
    received: Mapping[str, np.ndarray],
    trained: Mapping[str, np.ndarray],
    server_round: int,
) -> np.ndarray:
    """Distributed DP's vector: the update (trained - received, over the arrays the layout names, in order) clipped,
    scaled and rounded to integers with this client's share of the noise (common/methods/distributed_dp.py), sized
    for the cohort announced at setup; the weight coordinate is 1. The noise is drawn from the operating system
    unless a study fixes dp-noise-seed (then the server could draw it again: no privacy against it)."""
    missing = [name for name in trained if name not in received or received[name].size != trained[name].size]
    if missing:
        raise SecAggRefused(f"distributed DP: the upload's {missing[:3]} were not received: no update to bound")
    update = np.concatenate([trained[name] - np.asarray(received[name], np.float64).reshape(-1) for name in trained])
    z = noise_multiplier_for(cfg.dp_noise_multiplier, cfg.dp_target_epsilon, cfg.num_rounds, cfg.dp_delta)
    params = cfg.secagg_params
    try:
        plan = plan_round(
            cfg.dp_clip_norm, z, update.size, session.cohort.num_clients, params.modulus_range, cfg.dp_colluding_clients
        )
    except ValueError as exc:
        raise SecAggRefused(f"distributed DP: {exc}") from None
    rng = (
        np.random.default_rng([cfg.dp_noise_seed, session.node_id, server_round, 0x646470])
        if cfg.dp_noise_seed
        else np.random.default_rng()
    )
    contribution = client_contribution(update, cfg.dp_clip_norm, plan, rng)
    vector, _ = encode(dp_layout(update.size), {DP_UPDATE: contribution}, 0.0, params, rng, units=1)
    return vector


def withheld(msg: Message, reply: RecordDict) -> RecordDict:
    """The reply with the fixed withheld metrics (and the round echo) in place of the client's own."""
    echo = _echo(msg)
    for key, value in WITHHELD_TRAIN_METRICS.items():
        echo[key] = value
    reply[METRICS] = echo
    return reply


def unmask(cfg: RunConfig, msg: Message, context: Context) -> RecordDict:
    """Stage 3: the shares the server may have (never both of one neighbour); the session ends."""
    session = _load(cfg, context, _round(msg))
    shares = session.unmask(*read_unmask(msg.content.config_records))
    del context.state.config_records[SESSION]
    return RecordDict({SECAGG: ConfigRecord(secrets_record(shares)), METRICS: _echo(msg)})
