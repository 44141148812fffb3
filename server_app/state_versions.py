"""The newest client state each client reported holding (its replies' state-round), sent back with its next message
(expect-state) so that a client whose newest state file was deleted, or whose state folder was replaced by an older
copy, refuses the message instead of going on from an older or a fresh state without a word. Kept in the server's
signed checkpoint; forgotten for a partition taken over by another node (its state stays with the old one) and,
once, where the operator lets a holder whose state is missing start afresh (`pflower allow-takeover ...
--fresh-state`), which the next messages tell it (fresh-state) until it has answered one.

What it cannot see: a state the client saved in a round whose reply the server did not accept (a straggler's, a
timed-out or a rejected one) is newer than the record, so deleting that one file goes back to the recorded round's
state without a word; nothing older than the record is ever used silently."""

from __future__ import annotations

from collections.abc import Mapping
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.supercore import log

from common.wire.messages import EXPECT_STATE, FRESH_STATE, STATE_ROUND
from common.wire.validation import PayloadError

from .takeover import FRESH_STATE_FILE, OperatorConsent

CHECKPOINT_KEY = "client-state-rounds"  # where the server's checkpoint state keeps them
MISSING = "is missing ("  # in the reason of a client's error reply when its state is older than expected


class StateVersions:
    """Per partition: the round of the newest client state its holder reported; none for a client that holds none."""

    def __init__(self, run_dir: Path | None = None) -> None:
        self.rounds: dict[int, int] = {}
        self.consent = OperatorConsent(run_dir, FRESH_STATE_FILE)
        self.refused: set[int] = set()  # partitions whose holder answered that its state is missing
        self.fresh: set[int] = set()  # partitions told to start afresh, until a reply of theirs is accepted

    def note(self, partition_id: int, metrics: Mapping[str, Any] | None, server_round: int) -> None:
        """Keep what an accepted reply reports (nothing from a client that does not report it, an older version);
        PayloadError when the value is not a round in [-1, the message's round]."""
        if metrics is None or STATE_ROUND not in metrics:
            return
        value = metrics[STATE_ROUND]
        if type(value) is not int or not -1 <= value <= server_round:
            raise PayloadError(f"{STATE_ROUND} = {value!r} is not a round in [-1, {server_round}]")
        self.fresh.discard(partition_id)  # it answered: a message that told it to start afresh reached it
        self.refused.discard(partition_id)
        if value >= 0:
            self.rounds[partition_id] = max(value, self.rounds.get(partition_id, -1))

    def instructions(self, partition_id: int, node_id: int) -> dict[str, Any]:
        """What the next message to this client says of its state: the round it must hold (expect-state), or, once
        the operator let a holder that answered its state is missing start afresh, that it starts from none
        (fresh-state, repeated until a reply of its is accepted: a message lost on the way must not leave it to go
        on from an older state). The consent file is read only for such a holder."""
        if partition_id in self.refused and partition_id in self.rounds and self.consent.allows(partition_id, node_id):
            log(
                INFO,
                "client %d: starts afresh without its state of round %d (operator's consent)",
                partition_id,
                self.rounds.pop(partition_id),
            )
            self.refused.discard(partition_id)
            self.fresh.add(partition_id)
        if partition_id in self.fresh:
            return {FRESH_STATE: True}
        expected = self.rounds.get(partition_id)
        return {} if expected is None else {EXPECT_STATE: expected}

    def forget(self, partition_id: int) -> None:
        """A new node took the partition over: it starts from no state of this run."""
        self.rounds.pop(partition_id, None)
        self.refused.discard(partition_id)
        self.fresh.discard(partition_id)

    def explain(self, partition_id: int, node_id: int, reason: str) -> None:
        """After a client's error reply: when it is a missing state, the line that says how to let it start afresh
        (and the holder is marked, so its consent is looked for)."""
        if MISSING in reason and partition_id in self.rounds:
            self.refused.add(partition_id)
            log(
                WARNING,
                "client %d holds no state of round %d, the newest it reported: put its state folder back from a "
                "backup, or let it start afresh with %s",
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
