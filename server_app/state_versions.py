"""The newest client state each client reported holding (its replies' state-round), sent back with its next message
(expect-state) so that a client whose newest state file was deleted, or whose state folder was replaced by an older
copy, refuses the message instead of going on from an older or a fresh state without a word. Kept in the server's
signed checkpoint; forgotten for a partition taken over by another node (its state stays with the old one) and,
once, where the operator lets a holder go on without its state (`pflower allow-takeover ... --fresh-state`)."""

from __future__ import annotations

from collections.abc import Mapping
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.supercore import log

from common.wire.messages import STATE_ROUND
from common.wire.validation import PayloadError

from .takeover import FRESH_STATE_FILE, OperatorConsent

CHECKPOINT_KEY = "client-state-rounds"  # where the server's checkpoint state keeps them
MISSING = "is missing ("  # in the reason of a client's error reply when its state is older than expected


class StateVersions:
    """Per partition: the round of the newest client state its holder reported; none for a client that holds none."""

    def __init__(self, run_dir: Path | None = None) -> None:
        self.rounds: dict[int, int] = {}
        self.consent = OperatorConsent(run_dir, FRESH_STATE_FILE)

    def note(self, partition_id: int, metrics: Mapping[str, Any] | None, server_round: int) -> None:
        """Keep what an accepted reply reports (nothing from a client that does not report it, an older version);
        PayloadError when the value is not a round in [-1, the message's round]."""
        if metrics is None or STATE_ROUND not in metrics:
            return
        value = metrics[STATE_ROUND]
        if type(value) is not int or not -1 <= value <= server_round:
            raise PayloadError(f"{STATE_ROUND} = {value!r} is not a round in [-1, {server_round}]")
        if value >= 0:
            self.rounds[partition_id] = max(value, self.rounds.get(partition_id, -1))

    def expected(self, partition_id: int, node_id: int) -> int | None:
        """The round the next message names (None: no expectation), unless the operator let this holder go on
        afresh, which forgets it once, logged."""
        expected = self.rounds.get(partition_id)
        if expected is not None and self.consent.allows(partition_id, node_id):
            del self.rounds[partition_id]
            log(
                INFO,
                "client %d: going on without its client state of round %d (operator's consent)",
                partition_id,
                expected,
            )
            return None
        return expected

    def forget(self, partition_id: int) -> None:
        """A new node took the partition over: it starts from no state of this run."""
        self.rounds.pop(partition_id, None)

    def explain(self, partition_id: int, node_id: int, reason: str) -> None:
        """After a client's error reply: when it is a missing state, the line that says how to let it go on afresh."""
        if MISSING in reason and partition_id in self.rounds:
            log(
                WARNING,
                "client %d holds no state of round %d, the newest it reported: put its state folder back from a "
                "backup, or let it go on afresh with %s",
                partition_id,
                self.rounds[partition_id],
                self.consent.how(partition_id, node_id),
            )

    def state(self) -> dict[str, int]:
        """For the checkpoint."""
        return {str(pid): value for pid, value in sorted(self.rounds.items())}

    def load(self, saved: Any, checkpoint_round: int) -> None:
        """From a checkpoint (absent in one of an older version: no expectations); ValueError when malformed."""
        if saved is None:
            return
        if not isinstance(saved, dict) or not all(
            isinstance(k, str) and k.isdigit() and type(v) is int and 0 <= v <= checkpoint_round
            for k, v in saved.items()
        ):
            raise ValueError(f"checkpoint's {CHECKPOINT_KEY} is not a table of partitions and rounds")
        self.rounds = {int(k): v for k, v in saved.items()}
