"""ClientApp entry: load this node's partition, restore its state, dispatch to the algorithm's client half."""

from __future__ import annotations

from functools import lru_cache

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from common.config import RunConfig, parse_run_config
from common.data.federated import client_data

from .algorithms import ALGORITHMS, ClientEnv
from .state import ClientState

app = ClientApp()


class SimulatedDrop(RuntimeError):
    """Raised by a client the server told to fail (run-config drop-rate)."""


@lru_cache(maxsize=8)
def _config(items: tuple) -> RunConfig:
    from server_app.strategies import algorithm_config_keys

    return parse_run_config(dict(items), algorithms=ALGORITHMS, extra_keys=algorithm_config_keys())


def _partition(context: Context) -> tuple[int, int]:
    node = context.node_config
    if "partition-id" not in node or "num-partitions" not in node:
        raise ValueError("node config needs 'partition-id' and 'num-partitions' "
                         "(simulation sets them; on a device pass --node-config)")
    return int(node["partition-id"]), int(node["num-partitions"])


def resolve_device(name: str) -> torch.device:
    """auto: CUDA when present, else the CPU."""
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but no CUDA device is available")
        return torch.device("cuda")
    return torch.device("cpu")


def _env(context: Context) -> ClientEnv:
    cfg = _config(tuple(sorted(context.run_config.items())))
    if torch.get_num_threads() != cfg.client_threads:
        torch.set_num_threads(cfg.client_threads)
    partition_id, num_partitions = _partition(context)
    data = client_data(cfg, partition_id, num_partitions)
    return ClientEnv(cfg, data, ClientState(context.state), resolve_device(cfg.device))


def _round(msg: Message) -> int:
    return int(msg.content.config_records["config"]["server-round"])


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Handshake: tell the server which partition this node holds and how much data."""
    env = _env(context)
    partition_id, num_partitions = _partition(context)
    metrics = MetricRecord({"partition-id": partition_id, "num-partitions": num_partitions,
                            "num-train": env.data.num_train, "num-test": len(env.data.test_y)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training by the configured algorithm."""
    env = _env(context)
    if msg.content.config_records["config"].get("simulate-drop", False):
        # drop-rate: the server picked this client to fail this round; the error reply exercises the real path.
        raise SimulatedDrop(f"client {env.partition_id} dropped this round (simulated, drop-rate {env.cfg.drop_rate:g})")
    algorithm = ALGORITHMS[env.cfg.algorithm](env)
    return Message(algorithm.fit(_round(msg), msg.content), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluation at every shift degree by the configured algorithm."""
    env = _env(context)
    algorithm = ALGORITHMS[env.cfg.algorithm](env)
    return Message(algorithm.evaluate(_round(msg), msg.content), reply_to=msg)
