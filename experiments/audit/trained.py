"""The audit's `trained:ALGORITHM` uploads: what a DM-PFL or FedDST client really sends after its real local training.

The `sparse:D` form is a masked view of a dense model's update. A DM-PFL or FedDST client instead trains the sparse
network it holds (its mask on the global model theta_g = w_g * m_g) and uploads its values on its mask. Here the
algorithm's real server half builds round 1's training message, the real client half answers it on the attacked
batch (the batch is its training data: one epoch is one full-batch step, `local-epochs` the steps; SGD without
momentum or weight decay at the audit's learning rate), and the server's own decoding reads the reply. The attack
then sees what that server sees: the model it sent, the mask the client uploaded, and the values on it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from flwr.app import MessageType

from common.config import parse_run_config
from common.data.federated import ClientData, client_data, dataset_for
from common.hparams import ConfigError
from common.learning.models import ModelLayout, build_model
from common.seeding import derive_seed

TRAINED = ("dmpfl", "feddst")  # the algorithms whose real round the audit attacks


@dataclass(frozen=True)
class TrainedRound:
    """One real round of a sparse client, as its server sees it: the model the round started from (theta_g), the
    client's update at full shape (0 off its upload), per parameter the positions the client trained (m_g: on
    first contact a DM-PFL client's mask is m_g, and FedDST's is) and the trained positions it uploaded, which the
    attack observes (None: every one). Positions a readjustment regrew at the end of the round are uploaded at
    exactly 0 (outside m_g, or pruned and regrown inside it): their value says nothing of the data, so they are left
    out."""

    model: torch.nn.Module
    start: dict[str, torch.Tensor]
    update: dict[str, torch.Tensor]
    trained: dict[str, torch.Tensor | None]
    masks: dict[str, torch.Tensor | None]


def run_config(algorithm: str, dataset: str, data_dir: str, batch: int, steps: int, lr: float, seed: int) -> dict:
    """The run config of the attacked round: the algorithm's defaults, plain SGD, one full-batch step an epoch."""
    if algorithm not in TRAINED:
        raise ConfigError(f"upload 'trained:{algorithm}': one of {', '.join('trained:' + a for a in TRAINED)}")
    return {
        "dataset": dataset,
        **({"data-dir": data_dir} if data_dir else {}),
        "algorithm": algorithm,
        "batch-size": batch,
        "local-epochs": steps,
        "lr": lr,
        "momentum": 0.0,
        "weight-decay": 0.0,
        "seed": seed,
        "device": "cpu",
    }


@lru_cache(maxsize=4)
def _template(dataset: str, data_dir: str) -> ClientData:
    """A client's data record to put the attacked batch in (its shift and test sets are not used)."""
    raw = {"dataset": dataset, **({"data-dir": data_dir} if data_dir else {})}
    return client_data(parse_run_config(raw).data, 0, 10)


def trained_round(
    algorithm: str,
    dataset: str,
    data_dir: str,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    lr: float,
    seed: int,
) -> TrainedRound:
    """Round 1 of `algorithm` for one client whose training data is the batch (x, y): the real message, the real
    local training, the real reply, decoded by the real server."""
    from client_app.algorithms import ClientEnv, answer, client_class
    from client_app.state import ClientState
    from server_app.clients import ClientRegistry
    from server_app.replies import TrainReply
    from server_app.strategies import strategy_class

    cfg = parse_run_config(run_config(algorithm, dataset, data_dir, len(y), steps, lr, seed))
    data = dataset_for(cfg.data)
    model = build_model(cfg.model, cfg.dataset, data.input_shape, data.num_classes, derive_seed(cfg.seed, "model"))
    strategy = strategy_class(algorithm)(cfg, ModelLayout.of(model), ClientRegistry())
    content = strategy.train_message(1, 0, strategy.round_payload(1, "train"))
    batch = dataclasses.replace(_template(dataset, data_dir), train_x=x, train_y=y)
    client = client_class(algorithm)(ClientEnv(cfg, batch, ClientState(), torch.device("cpu")))
    reply = TrainReply(0, len(y), 0.0, answer(client, MessageType.TRAIN, 1, content))
    strategy.decode_train_reply(1, reply)
    values, sent = reply.payload
    global_masks = strategy.global_masks  # type: ignore[attr-defined]  # a sparse strategy's m_g
    names = [name for name, _ in model.named_parameters()]
    held = dict(zip([name for name, _ in strategy.specs], strategy.global_arrays, strict=True))
    start: dict[str, torch.Tensor] = {}
    update: dict[str, torch.Tensor] = {}
    trained: dict[str, torch.Tensor | None] = {}
    masks: dict[str, torch.Tensor | None] = {}
    for name in names:
        theta = np.asarray(held[name], np.float32)
        if name in global_masks:  # the client trains theta_g = w_g * m_g
            theta = np.where(global_masks[name], theta, 0.0).astype(np.float32)
        if name in sent:
            mask = np.asarray(sent[name], bool)
            new = theta.copy()
            new[mask] = values[name]
            on_global = np.asarray(global_masks[name], bool) if name in global_masks else np.ones_like(mask)
            regrown = mask & (new == 0) & (theta != 0) if name in global_masks else np.zeros_like(mask)
            masks[name] = torch.from_numpy(mask & on_global & ~regrown)
            trained[name] = torch.from_numpy(on_global)
        else:
            new = np.asarray(values[name], np.float32).reshape(theta.shape)
            masks[name] = trained[name] = None
        start[name] = torch.from_numpy(theta)
        update[name] = torch.from_numpy(new - theta)
    return TrainedRound(model, start, update, trained, masks)
