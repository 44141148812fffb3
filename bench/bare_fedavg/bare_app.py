"""Bare Flower FedAvg: flwr's FedAvg strategy and a plain ClientApp; the same model, data and loop as pflower."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from common.config import parse_run_config
from common.data.federated import client_data, dataset_for
from common.evaluate import predict_logits
from common.models import build_model
from common.seeding import derive_seed
from common.train import TrainSettings
from common.train import train as train_loop

server = ServerApp()
client = ClientApp()


def _cfg(context: Context):
    return parse_run_config(dict(context.run_config))


def _model(cfg):
    data = dataset_for(cfg)
    return build_model("auto", cfg.dataset, data.input_shape, data.num_classes, derive_seed(cfg.seed, "model"))


@server.main()
def main(grid: Grid, context: Context) -> None:
    """Flower's FedAvg, evaluating every client every round."""
    cfg = _cfg(context)
    strategy = FedAvg(fraction_train=cfg.fraction_train, fraction_evaluate=1.0, min_available_nodes=2)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(_model(cfg).state_dict()), num_rounds=cfg.num_rounds)


def _data(context: Context):
    cfg = _cfg(context)
    torch.set_num_threads(1)
    return cfg, client_data(cfg, int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))


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
