"""Local training: every client trains alone; no weights travel in either direction."""

from __future__ import annotations

from typing import Any

from flwr.app import RecordDict

from common.wire.messages import CONFIG

from ..replies import TrainReply
from .base import PFLStrategy


class LocalStrategy(PFLStrategy):
    """Each client keeps and trains its own model ('CLT'); the server only schedules and collects metrics."""

    uploads_weights = False
    sends_weights_for_eval = False

    def shared_payload(self, server_round: int) -> dict[str, Any]:
        """Nothing is shared."""
        return {}

    def train_content(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """Only the round's instructions."""
        return RecordDict({CONFIG: self.round_config(server_round, partition_id)})

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """Nothing to aggregate."""
