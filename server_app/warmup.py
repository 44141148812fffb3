"""Round 0 of the algorithms that pre-train (FedAMP's `pretrain-epochs`): every client trains once from the common
initialization before round 1, and the strategy takes the replies a window at a time (server memory holds one
window of models, not all of them); its traffic and FLOPs count in round 1's record."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import Message

from .replies import TrainReply, reply_flops

Accept = Callable[[list[Message]], tuple[list[TrainReply], int, int]]  # replies -> accepted, failed, rejected


def pretrain_round(
    chunks: Iterable[list[Message]], window: int, accept: Accept, aggregate: Callable[[list[TrainReply]], None]
) -> dict[str, Any]:
    """Hand `aggregate` the accepted replies of round 0 once per `window` of replies (the strategy's step may touch
    every client, e.g. FedAMP's Gram rows: once per window, not per reply); returns the used, failed and rejected
    counts and the FLOPs of the accepted replies."""
    counts = {"used": 0, "failed": 0, "rejected": 0, "flops": 0.0}
    batch: list[Message] = []

    def fold() -> None:
        accepted, failed, rejected = accept(batch)
        aggregate(accepted)
        counts["used"] += len(accepted)
        counts["failed"] += failed
        counts["rejected"] += rejected
        counts["flops"] += sum(reply_flops(r.content) for r in accepted)
        batch.clear()

    for replies in chunks:
        batch.extend(replies)
        if len(batch) >= window:
            fold()
    fold()
    return counts
