"""ClientApp entry: load this node's partition, restore its state, dispatch to the algorithm's client half."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import lru_cache
from logging import ERROR, WARNING
from pathlib import Path

import torch
from flwr.app import ConfigRecord, Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode
from flwr.supercore import log

from common import profiling
from common.config import ConfigError, RunConfig, due, parse_run_config
from common.data.datasets import DataError
from common.data.federated import client_data
from common.secagg.protocol import SecAggRefused
from common.secagg.wire import SETUP, SHARE, UNMASK
from common.sections import OutputSettings
from common.storage.persist import CLIENT_STATE_FOLDER, StateFileError, is_hex
from common.wire.messages import (
    CHECKPOINT_ROUND,
    CONFIG,
    DP_NOISE_FLOOR,
    EXPECT_STATE,
    FRESH_STATE,
    METRICS,
    NEWCOMER_MODEL,
    NUM_PARTITIONS,
    NUM_TEST,
    NUM_TRAIN,
    PARTITION_ID,
    REASON,
    REFUSED,
    RUN_ID,
    SECAGG,
    SERVER_ROUND,
    SIMULATE_DROP,
    STATE_DIR,
    STATE_KEY,
    STATE_ROUND,
)
from common.wire.validation import PayloadError, is_folder_name, read_count

from . import secure
from .algorithms import ClientEnv, answer, client_class
from .algorithms.newcomer import NewcomerClient
from .privacy import WITHHELD_COUNT, below_floor
from .simulation import declared_num_train, simulated_drop
from .state import ClientState, StateDir, StateStore, pick_store

app = ClientApp()


@lru_cache(maxsize=8)
def _config(items: tuple) -> RunConfig:
    return parse_run_config(dict(items))


def _partition(context: Context) -> tuple[int, int]:
    node = context.node_config
    if PARTITION_ID not in node or NUM_PARTITIONS not in node:
        raise ValueError(
            "node config needs 'partition-id' and 'num-partitions' "
            "(simulation sets them; on a device pass --node-config)"
        )
    return int(node[PARTITION_ID]), int(node[NUM_PARTITIONS])


def resolve_device(name: str) -> torch.device:
    """auto: CUDA when present, else the CPU."""
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but no CUDA device is available")
        return torch.device("cuda")
    return torch.device("cpu")


def state_dir(context: Context, msg: Message, output: OutputSettings) -> StateDir | None:
    """This client's state dir for the run: node config 'state-dir' (a device), else run config
    'client-state-dir' (a simulation; `auto`: the run folder's `client-state/`), under the run's state key and
    the partition; None to keep the state in memory (`memory`, or `auto` where the folder cannot be made)."""
    root = context.node_config.get(STATE_DIR) or output.client_state_dir
    key = msg.content.config_records[CONFIG].get(STATE_KEY) if CONFIG in msg.content.config_records else None
    if root == "memory" or not key:
        return None
    if not is_folder_name(key):  # the server names the run's folder; it must stay inside the state dir
        raise PayloadError(f"state-key {key!r} is not a plain folder name; message refused")
    run_id = msg.content.config_records[CONFIG].get(RUN_ID, "")
    if not isinstance(run_id, str) or len(run_id) > 32 or (run_id and not is_hex(run_id)):
        raise PayloadError("run-id is not a run id (up to 32 hex digits); message refused")
    partition_id, _ = _partition(context)
    if root != "auto":  # a device: one folder per run, so two runs of one name never share state
        folder = f"{str(key)}.{run_id[:12]}" if run_id else str(key)
        path = Path(str(root)).expanduser() / folder / f"partition-{partition_id}"
        return StateDir(path, run=str(key), partition=partition_id, run_id=run_id)
    # a resumed run keeps its folder, whose name is the state key the server sends
    run_folder = Path(output.resume).expanduser() if output.resume else output.results_dir / str(key)
    path = run_folder / CLIENT_STATE_FOLDER / f"partition-{partition_id}"
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not os.access(existing, os.W_OK):  # folders are made by the first save, only where there is state
        if path.parent not in _unwritable:
            _unwritable.add(path.parent)
            log(WARNING, "client state kept in memory: %s is not writable; set the node config's state-dir", existing)
        return None
    return StateDir(path, run=str(key), partition=partition_id, run_id=run_id)


_unwritable: set[Path] = set()


@profiling.timed("env")
def _env(context: Context, msg: Message, training: bool = False) -> tuple[ClientEnv, StateStore]:
    """The client's config, data, state (from where its store keeps it) and device, and the store."""
    cfg = _config(tuple(sorted(context.run_config.items())))
    if torch.get_num_threads() != cfg.client_threads:
        torch.set_num_threads(cfg.client_threads)
    partition_id, num_partitions = _partition(context)
    data = client_data(cfg.data, partition_id, num_partitions)
    store = pick_store(state_dir(context, msg, cfg.output), context.state)
    state = store.restore(_round(msg), training)
    if starts_afresh(msg, partition_id, state):
        state = ClientState()
    check_version(store, state, msg, partition_id)
    return ClientEnv(cfg, data, state, resolve_device(cfg.device)), store


def starts_afresh(msg: Message, partition_id: int, state: ClientState) -> bool:
    """Whether the operator let this client start afresh (fresh-state): the state it holds is set aside (the next
    save makes the newest version its own), logged."""
    config = msg.content.config_records.get(CONFIG)
    if config is None or config.get(FRESH_STATE) is not True:
        return False
    if state.tree:
        log(
            WARNING,
            "client %d: starts afresh, its state of round %s set aside (operator's consent)",
            partition_id,
            state.version,
        )
    return True


def check_version(store: StateStore, state: ClientState, msg: Message, partition_id: int) -> None:
    """StateFileError when the server knows this client holds a newer state than the one restored (the message's
    expect-state): its newest file was deleted, or an older copy of its folder put back, and going on from an
    older or a fresh state would be silent. A store in memory reports no round, so the server expects none from it
    (a checkpoint of a run that kept its states on disk aside): then a warning."""
    config = msg.content.config_records.get(CONFIG)
    if config is None or EXPECT_STATE not in config:  # a server that keeps no record (an older version)
        return
    expected = read_count(config, EXPECT_STATE, allow_zero=True)
    if state.version is not None and state.version >= expected:
        return
    found = f"its newest is of round {state.version}" if state.version is not None else "it has none"
    if not store.checks_versions:
        if not state.tree:
            log(
                WARNING,
                "client %d: the server expects its state of round %d; kept in memory, %s: it starts afresh",
                partition_id,
                expected,
                found,
            )
        return
    raise StateFileError(
        f"client {partition_id}: its state of round {expected} is missing ({found}): a state file was deleted or an "
        "older copy of the state folder put back. Put the folder back from a backup, or have the operator let it go "
        "on afresh (the server's line gives the command)"
    )


@profiling.timed("persist")
def _persist(env: ClientEnv, store: StateStore, msg: Message, reply: Message) -> None:
    """Keep the state when the message changed it, where its store keeps it, and name in the reply the round of the
    newest state the client now holds (state-round; -1: none), which the server names back in its next message."""
    held = env.state.version if env.state.version is not None else -1
    if env.state.dirty:
        config = msg.content.config_records[CONFIG]
        checkpoint = read_count(config, CHECKPOINT_ROUND, allow_zero=True) if CHECKPOINT_ROUND in config else None
        due_now = due(_round(msg), env.cfg.checkpoint_every, env.cfg.num_rounds)
        store.persist(env.state, _round(msg), checkpoint, due_now)
        held = _round(msg)
    if store.checks_versions and not reply.has_error() and METRICS in reply.content.metric_records:
        reply.content.metric_records[METRICS][STATE_ROUND] = held


def _round(msg: Message) -> int:
    return read_count(msg.content.config_records.get(CONFIG), SERVER_ROUND, allow_zero=True)


def _state_refused(msg: Message, exc: StateFileError) -> Message:
    """One ERROR line and an error reply for stored state that fails to load or to be signed: the round goes on
    without this client rather than with a fresh state in place of the one it had (the server logs the reason)."""
    log(ERROR, "client state refused: %s", exc)
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"StateFileError: {exc}"), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Handshake: tell the server which partition this node holds and how much data. A node whose data cannot be
    made (the run's settings, e.g. more clients than the partition can feed) says why in a 'refused' record
    instead of raising, so the run stops with that one line rather than a traceback per node."""
    with profiling.record("client", kind="query", round=0):
        try:
            env, _ = _env(context, msg)
        except (DataError, ConfigError) as exc:
            return Message(RecordDict({REFUSED: ConfigRecord({REASON: str(exc)})}), reply_to=msg)
    if why := below_floor(env.cfg.privacy, context.node_config.get(DP_NOISE_FLOOR)):
        log(WARNING, "this device does not take part in the run: %s", why)
        return Message(RecordDict({REFUSED: ConfigRecord({REASON: why})}), reply_to=msg)
    partition_id, num_partitions = _partition(context)
    withheld = env.cfg.privacy.withholds_metrics  # local DP: no count of this client's data leaves it
    hidden = withheld or env.cfg.secagg != "none"  # secure aggregation: the count travels inside the masked sum
    metrics = MetricRecord(
        {
            PARTITION_ID: partition_id,
            NUM_PARTITIONS: num_partitions,
            NUM_TRAIN: WITHHELD_COUNT if hidden else declared_num_train(env.cfg.faults, env.data),
            NUM_TEST: WITHHELD_COUNT if withheld else len(env.data.test_y),
        }
    )
    return Message(RecordDict({METRICS: metrics}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training by the configured algorithm."""
    with profiling.record("client", kind="train", round=_round(msg)):
        try:
            env, store = _env(context, msg, training=True)
        except StateFileError as exc:
            return _state_refused(msg, exc)
        if why := below_floor(env.cfg.privacy, context.node_config.get(DP_NOISE_FLOOR)):
            log(WARNING, "training refused: %s", why)
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=why), reply_to=msg)
        config = msg.content.config_records[CONFIG]
        if config.get(SIMULATE_DROP, False):
            return simulated_drop(msg, env.partition_id, env.cfg.drop_rate)
        algorithm = client_class(env.cfg.algorithm)(env)
        content = answer(algorithm, MessageType.TRAIN, _round(msg), msg.content)
        if env.cfg.secagg != "none" and SECAGG in msg.content.config_records:
            try:
                content = secure.masked_reply(env.cfg, msg, context, content)
            except (SecAggRefused, PayloadError, ValueError) as exc:
                return _secure_refused(msg, exc)
        elif env.cfg.secagg != "none":  # a round that uploads nothing (DM-PFL's phase 3): no count or loss either
            content = secure.withheld(msg, content)
        reply = Message(content, reply_to=msg)
        try:
            _persist(env, store, msg, reply)
        except StateFileError as exc:  # e.g. a key file that is not this user's: the state could not be kept
            return _state_refused(msg, exc)
    return reply


def _secure_refused(msg: Message, exc: Exception) -> Message:
    """One WARNING line and an error reply for a secure-aggregation request this client will not serve: the server
    counts it as a dropout (the protocol's masks of it are removed)."""
    log(WARNING, "secure aggregation: %s", exc)
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"secure aggregation: {exc}"), reply_to=msg)


def _secure_stage(
    msg: Message, context: Context, stage: Callable[[RunConfig, Message, Context], RecordDict]
) -> Message:
    """One SecAgg+ stage (client_app/secure.py), refused with one line rather than a traceback."""
    with profiling.record("client", kind=msg.metadata.message_type, round=0):
        try:
            cfg = _config(tuple(sorted(context.run_config.items())))
            return Message(stage(cfg, msg, context), reply_to=msg)
        except (SecAggRefused, PayloadError, ValueError, ConfigError) as exc:
            return _secure_refused(msg, exc)


@app.train(SETUP.split(".")[1])
def secagg_setup(msg: Message, context: Context) -> Message:
    """SecAgg+ stage 0: the round's public keys."""
    return _secure_stage(msg, context, lambda cfg, m, c: secure.setup(cfg, m, c, _partition(c)[0]))


@app.train(SHARE.split(".")[1])
def secagg_share(msg: Message, context: Context) -> Message:
    """SecAgg+ stage 1: the encrypted shares for the neighbours."""
    return _secure_stage(msg, context, secure.share)


@app.train(UNMASK.split(".")[1])
def secagg_unmask(msg: Message, context: Context) -> Message:
    """SecAgg+ stage 3: the shares that remove the masks."""
    return _secure_stage(msg, context, secure.unmask)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluation at every shift degree by the configured algorithm."""
    with profiling.record("client", kind="evaluate", round=_round(msg)):
        try:
            env, store = _env(context, msg)
        except StateFileError as exc:
            return _state_refused(msg, exc)
        if env.cfg.privacy.withholds_metrics:  # the device's own rule, whatever the server asks
            why = "evaluation withheld: under local DP (dp-local-metrics = withhold) no statistic of the data leaves"
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=why), reply_to=msg)
        config = msg.content.config_records.get(CONFIG)
        newcomer = config is not None and config.get(NEWCOMER_MODEL, False) is True  # a held-out client
        algorithm = (NewcomerClient if newcomer else client_class(env.cfg.algorithm))(env)
        reply = Message(answer(algorithm, MessageType.EVALUATE, _round(msg), msg.content), reply_to=msg)
        try:
            _persist(env, store, msg, reply)
        except StateFileError as exc:
            return _state_refused(msg, exc)
    return reply
