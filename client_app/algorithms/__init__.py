"""Client halves by algorithm name, as the specs in common/algorithms.py name them ("module:Class")."""

from __future__ import annotations

from typing import cast

from flwr.app import MessageType, RecordDict

from common.algorithms import SPECS, resolve_half
from common.wire.messages import METRICS
from common.wire.validation import echo_values

from ..privacy import withheld_train_metrics
from ..simulation import attacked_reply
from .base import ClientAlgorithm, ClientEnv


def client_class(algorithm: str) -> type[ClientAlgorithm]:
    """The client half of a registered algorithm (only its module is imported: a device loads one algorithm)."""
    # resolve_half checks the subclass at run time; the cast tells mypy (an abstract base is no concrete type[])
    return cast("type[ClientAlgorithm]", resolve_half(__name__, SPECS[algorithm].client, ClientAlgorithm))


def answer(algorithm: ClientAlgorithm, message_type: str, server_round: int, content: RecordDict) -> RecordDict:
    """The algorithm's reply to a training or evaluation message, naming the round (and phase) it answers."""
    algorithm.receive(content)
    if message_type == MessageType.TRAIN:
        reply = attacked_reply(algorithm.cfg.faults, algorithm.env.data, content, algorithm.fit(server_round, content))
        reply = withheld_train_metrics(algorithm.cfg.privacy, algorithm.private_reply(server_round, content, reply))
    else:
        reply = algorithm.evaluate(server_round, content)
    metrics = reply.metric_records[METRICS]
    for key, value in echo_values(algorithm.instructions(content)).items():
        metrics[key] = value
    return reply


__all__ = ["ClientAlgorithm", "ClientEnv", "answer", "client_class"]
