"""Bare Flower FedAvg: flwr's FedAvg strategy and a plain ClientApp; the same model, data and loop as pflower."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from common.config import parse_run_config
from common.data.federated import client_data, dataset_for
from common.learning.evaluate import predict_logits
from common.learning.models import build_model
from common.learning.train import TrainSettings
from common.learning.train import train as train_loop
from common.seeding import derive_seed

server = ServerApp()
client = ClientApp()


# Keys of this app only (not pflower's run config): the share of clients evaluated each round, and a file to which
# each training and evaluation round's wall time and samples are appended as JSON lines (bench/throughput.py,
# bench/scale.py).
_OWN_KEYS = ("fraction-evaluate", "round-times")


def _cfg(context: Context):
    return parse_run_config({k: v for k, v in context.run_config.items() if k not in _OWN_KEYS})


class _TimedFedAvg(FedAvg):
    """Flower's FedAvg, unchanged, timing each training and evaluation round from its messages' making to its
    aggregate."""

    def __init__(self, times_file: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.times_file = times_file
        self.started = 0.0

    def _timed(self, kind: str, server_round: int, replies: list[Message], aggregate):
        out = aggregate(server_round, replies)
        samples = sum(int(r.content["metrics"]["num-examples"]) for r in replies if r.has_content())
        with open(self.times_file, "a") as fh:
            fh.write(
                json.dumps(
                    {
                        "round": server_round,
                        "kind": kind,
                        "wall_s": time.monotonic() - self.started,
                        "num_examples": samples,
                        "replies": len(replies),
                    }
                )
                + "\n"
            )
        return out

    def configure_train(self, server_round: int, arrays: ArrayRecord, config, grid: Grid) -> Iterable[Message]:
        self.started = time.monotonic()
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        return self._timed("train", server_round, list(replies), super().aggregate_train)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config, grid: Grid) -> Iterable[Message]:
        self.started = time.monotonic()
        return super().configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        return self._timed("evaluate", server_round, list(replies), super().aggregate_evaluate)


def _model(cfg):
    data = dataset_for(cfg.data)
    return build_model(cfg.model, cfg.dataset, data.input_shape, data.num_classes, derive_seed(cfg.seed, "model"))


@server.main()
def main(grid: Grid, context: Context) -> None:
    """Flower's FedAvg, evaluating `fraction-evaluate` of the clients (default all) every round."""
    cfg = _cfg(context)
    options = {
        "fraction_train": cfg.fraction_train,
        "min_available_nodes": 2,
        "fraction_evaluate": float(context.run_config.get("fraction-evaluate", 1.0)),
    }
    times_file = str(context.run_config.get("round-times", ""))
    strategy = _TimedFedAvg(times_file, **options) if times_file else FedAvg(**options)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(_model(cfg).state_dict()), num_rounds=cfg.num_rounds)


def _data(context: Context):
    cfg = _cfg(context)
    torch.set_num_threads(1)
    return cfg, client_data(
        cfg.data, int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    )


@client.train()
def fit(msg: Message, context: Context) -> Message:
    """Train the received model for the configured epochs."""
    cfg, data = _data(context)
    model = _model(cfg)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    rnd = int(msg.content["config"]["server-round"])
    generator = torch.Generator().manual_seed(derive_seed(cfg.seed, "train", data.partition_id, rnd))
    settings = TrainSettings(cfg.local_epochs, cfg.batch_size, "sgd", cfg.lr)
    stats = train_loop(model, data.train_x, data.train_y, settings, generator)
    metrics = MetricRecord({"train_loss": stats.mean_loss, "num-examples": stats.num_samples})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)


@client.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Accuracy of the received model on the client's test split."""
    cfg, data = _data(context)
    model = _model(cfg)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    accuracy = float((predict_logits(model, data.test_x).argmax(1) == data.test_y).float().mean())
    metrics = MetricRecord({"eval_acc": accuracy, "num-examples": len(data.test_y)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
