"""The lines a run logs as it goes: its settings, and each round's progress with its ETA; and the round's record."""

from __future__ import annotations

from typing import Any, cast

from common.config import RunConfig
from common.learning.evaluate import shift_key
from common.storage.run_folder import RoundRecord

from ..replies import RoundLog


def round_record(server_round: int, wall: float, elapsed: float, log: RoundLog, extra: dict[str, Any]) -> RoundRecord:
    """A round's line of metrics.jsonl, from its counters and the algorithm's own fields."""
    record: dict[str, Any] = {
        "round": server_round,
        "wall_s": wall,
        "elapsed_s": elapsed,
        "train": log.train,
        "bytes": log.bytes,
        "bytes_per_client": {str(k): v for k, v in sorted(log.per_client_bytes.items())},
        "eval": log.eval,
        **({"aggregate_s": log.aggregate_s} if log.aggregate_s is not None else {}),
        **({"evaluate_s": log.evaluate_s} if log.evaluate_s is not None else {}),
        **({"unseen": log.unseen} if log.unseen else {}),
        **extra,
    }
    return cast(RoundRecord, record)


def settings_text(cfg: RunConfig, num_clients: int) -> str:
    """One log line with the run's main settings."""
    text = (
        f"{cfg.algorithm}: {num_clients} clients, {100 * cfg.fraction_train:.0f}% per round, {cfg.num_rounds} "
        f"rounds, {cfg.local_epochs} local epochs, lr {cfg.lr:g}"
    )
    text += f", robust aggregation {cfg.robust_aggregation}" if cfg.robust_aggregation != "none" else ""
    return text + (f", {cfg.dp} DP (delta {cfg.dp_delta:g})" if cfg.dp != "none" else "")


def progress_text(record: RoundRecord, num_rounds: int, degrees: tuple[float, ...], elapsed: float) -> str:
    """The progress log line of a finished round: replies, loss, traffic, accuracy, time and ETA."""
    rnd = record["round"]
    eta = elapsed / rnd * (num_rounds - rnd)
    train = record["train"]
    private = train.get("dp")
    hidden = private and (private.get("metrics") == "withheld" or private.get("mode") == "distributed")
    loss = "withheld" if hidden else f"{train['loss']:.4f}"
    text = (
        f"[round {rnd}/{num_rounds}] train {train['used']}/{train['sent']} used, loss {loss}"
        f" | down {record['bytes']['train_down'] / 1e6:.2f} MB up {record['bytes']['train_up'] / 1e6:.2f} MB"
    )
    evaluation = record["eval"]
    if evaluation:
        mean, std = evaluation["mean"], evaluation["std"]
        k0, k1 = shift_key(min(degrees)), shift_key(max(degrees))
        text += (
            f" | acc {100 * mean[k0]:.2f}+/-{100 * std[k0]:.2f}% (shift {100 * max(degrees):g}%: {100 * mean[k1]:.2f}%)"
        )
    if private:
        text += f" | DP epsilon {private['epsilon']:.3f}"
    seconds = int(round(eta))
    return text + f" | {record['wall_s']:.1f}s, ETA {seconds // 60}m{seconds % 60:02d}s"
