"""Round 0 of the algorithms that pre-train (FedAMP's `pretrain-epochs`): every client trains once from the common
initialization before round 1; its traffic and FLOPs count in round 1's record."""

from __future__ import annotations

from logging import INFO
from typing import Any

from flwr.app import Message, MessageType
from flwr.serverapp import Grid
from flwr.supercore import log

from .exchange import RunnerView, exchange
from .replies import reply_flops


def pretrain_round(runner: RunnerView, grid: Grid) -> None:
    """Send every client a round-0 training message, at most `messages-in-flight` out at once, and hand the
    strategy the replies as round 0, a window of them at a time (server memory holds one window of models, not
    all of them)."""
    clients = runner.clients.ids()
    train = runner.round_log.train
    used = failed = rejected = 0
    flops = 0.0
    faults: dict[str, Any] = {"late": 0, "dropped": [], "stragglers": []}
    batch: list[Message] = []

    def fold() -> None:
        nonlocal used, failed, rejected, flops
        accepted, batch_failed, batch_rejected = runner.accept_train_replies(0, batch, "pre-training")
        runner.strategy.aggregate(0, accepted)
        used, failed, rejected = used + len(accepted), failed + batch_failed, rejected + batch_rejected
        flops += sum(reply_flops(r.content) for r in accepted)
        for key in ("dropped", "stragglers", "late"):
            if key in train:
                faults[key] += train.pop(key)
        batch.clear()

    for replies in exchange(runner, grid, 0, clients, MessageType.TRAIN, "train_down"):
        batch.extend(replies)
        if len(batch) >= runner.cfg.messages_in_flight:  # the strategy's step may touch every client (FedAMP's
            fold()  # Gram rows): once per window of replies, not per reply
    fold()
    faults = {key: value for key, value in faults.items() if value or key == "late"}
    train["pretrain"] = {
        "sent": len(clients),
        "used": used,
        "failed": failed,
        "rejected": rejected,
        "flops": flops,
        **faults,
    }
    log(INFO, "pre-training: %d of %d clients trained from the common initialization", used, len(clients))
