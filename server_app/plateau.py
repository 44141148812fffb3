"""The `stop-patience` rule on a running federation: the accuracy curve so far, and when the run ends early."""

from __future__ import annotations

from logging import INFO

from flwr.supercore import log

from common.sections import EvaluationSettings
from common.stopping import accuracy_curve, best_round, stalled
from common.storage.run_folder import RoundRecord


class Plateau:
    """A run's accuracy curve (from its round records) and whether `stop-patience` ends it after a round;
    `stopped` says where it did."""

    def __init__(self, evaluation: EvaluationSettings) -> None:
        self.evaluation = evaluation
        self.curve: list[tuple[int, float]] = []  # (round, mean accuracy at shift 0)
        self.stopped: dict[str, float] | None = None

    def resumed(self, records: list[RoundRecord], last_round: int) -> bool:
        """Start from a resumed run's records; True when the run had already stopped after `last_round`."""
        self.curve = accuracy_curve(records)
        return self.ends_after(last_round)

    def ends_after(self, server_round: int, record: RoundRecord | None = None) -> bool:
        """Add the round's record to the curve; True (and logged) when the run stops after this round (never after
        its last: it ends anyway)."""
        cfg = self.evaluation
        self.curve += accuracy_curve([record] if record else [])
        if server_round >= cfg.num_rounds or not stalled(self.curve, cfg.stop_patience, cfg.stop_min_delta):
            return False
        self.stopped = {"round": server_round, "patience": cfg.stop_patience, "min_delta": cfg.stop_min_delta}
        log(
            INFO,
            "stopping after round %d of %d: the best mean accuracy (round %s) rose by no more than %g points in the "
            "last %d rounds (stop-patience)",
            server_round,
            cfg.num_rounds,
            best_round(self.curve),
            100 * cfg.stop_min_delta,
            cfg.stop_patience,
        )
        return True
