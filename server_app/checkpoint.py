"""Server checkpoints: after each round the strategy's state, the round records and the resume history, in one
atomically written .npz (no pickle); `resume` continues a run folder from its checkpoint."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.persist import CHECKPOINT_FILE, StateFileError, load_tree, save_tree

from .clients import RunAborted
from .results import ResultsWriter
from .strategies.base import PFLStrategy

FORMAT = 1
# Arrays this large are memory-mapped from the checkpoint on resume, not read into memory (FedAMP's client models).
MAP_FROM_BYTES = 64 << 20
# keys that may differ between a run and its resumption (the rest must match: clients read the same config)
RESUMABLE_CHANGES = frozenset(
    {"resume", "num-rounds", "round-timeout", "data-dir", "results-dir", "run-name", "checkpoint-every"}
)


@dataclass
class Checkpoint:
    """A run's state after `round` (records are the metrics.jsonl lines so far)."""

    round: int
    state: dict[str, Any]
    records: list[dict[str, Any]]
    elapsed_s: float = 0.0
    resumes: list[int] = field(default_factory=list)  # rounds earlier resumptions started after


def save_checkpoint(run_dir: Path, checkpoint: Checkpoint) -> int:
    """Write run_dir/checkpoint.npz atomically; returns its size in bytes."""
    tree = {
        "format": FORMAT,
        "round": checkpoint.round,
        "state": checkpoint.state,
        "records": json.dumps(checkpoint.records, sort_keys=True),
        "elapsed_s": checkpoint.elapsed_s,
        "resumes": list(checkpoint.resumes),
    }
    return save_tree(Path(run_dir) / CHECKPOINT_FILE, tree)


def load_checkpoint(run_dir: Path) -> Checkpoint:
    """The checkpoint of a run folder; StateFileError naming the file if it is missing or unreadable."""
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.is_file():
        raise StateFileError(
            f"{path} does not exist: the run wrote no checkpoint (checkpoint-every=0, or it "
            "stopped before its first round ended)"
        )
    try:
        tree = load_tree(path, map_from_bytes=MAP_FROM_BYTES)
    except RecursionError:
        raise StateFileError(f"{path}: damaged checkpoint (nested too deeply)") from None
    if not isinstance(tree, dict) or tree.get("format") != FORMAT:
        raise StateFileError(f"{path}: unknown checkpoint format")
    try:
        checkpoint = Checkpoint(
            int(tree["round"]),
            tree["state"],
            json.loads(str(tree["records"])),
            float(tree["elapsed_s"]),
            [int(r) for r in tree["resumes"]],
        )
        rounds = [int(record["round"]) for record in checkpoint.records]
    except (KeyError, TypeError, ValueError, RecursionError) as exc:  # json's errors are ValueErrors
        raise StateFileError(f"{path}: damaged checkpoint ({type(exc).__name__}: {exc})") from None
    if checkpoint.round < 1 or rounds != list(range(1, checkpoint.round + 1)) or not isinstance(checkpoint.state, dict):
        raise StateFileError(
            f"{path}: damaged checkpoint (round {checkpoint.round} with records of rounds "
            f"{rounds[:3]}{'...' if len(rounds) > 3 else ''})"
        )
    return checkpoint


def config_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Run-config keys whose values differ, other than those a resumption may change."""
    keys = (set(recorded) | set(current)) - RESUMABLE_CHANGES
    return sorted(k for k in keys if recorded.get(k) != current.get(k))


def due(server_round: int, every: int, num_rounds: int) -> bool:
    """Whether a round-periodic task (checkpoint, evaluation) runs: every `every` rounds (0: never) and after the
    last round."""
    return every > 0 and (server_round % every == 0 or server_round == num_rounds)


def restore(strategy: PFLStrategy, writer: ResultsWriter | None, checkpoint: Checkpoint) -> list[int]:
    """Load a checkpoint's state into the strategy and its round records into the writer; returns the rounds after
    which this run folder was resumed (RunAborted when the state does not fit the configured model)."""
    try:
        strategy.load_state_dict(checkpoint.state)
    except KeyError as exc:
        raise RunAborted(f"cannot resume from the checkpoint: its state lacks {exc}") from None
    except (ValueError, TypeError) as exc:
        raise RunAborted(f"cannot resume from the checkpoint: {exc}") from None
    if writer is not None:
        writer.restart_from(checkpoint.records)
    return [*checkpoint.resumes, checkpoint.round]
