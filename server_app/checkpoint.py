"""Server checkpoints: after each round the strategy's state, the round records and the resume history, in one
atomically written .npz (no pickle) signed with the server's key; `resume` continues a run folder from its
checkpoint."""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from common.storage.persist import (
    CHECKPOINT_FILE,
    StateFileError,
    atomic_write_text,
    is_hex,
    load_tree,
    private_folder,
    save_tree,
    signing_context,
    signing_key,
    sync_file_system,
    write_new,
)
from common.storage.run_folder import RoundRecord

from .clients import RunAborted
from .results import ResultsWriter
from .strategies.base import PFLStrategy

FORMAT = 1
# Arrays this large are memory-mapped from the checkpoint on resume, not read into memory (FedAMP's client models).
MAP_FROM_BYTES = 64 << 20
# keys that may differ between a run and its resumption (the rest must match: clients read the same config)
RESUMABLE_CHANGES = frozenset(
    {
        "resume",
        "num-rounds",
        "round-timeout",
        "data-dir",
        "results-dir",
        "run-name",
        "checkpoint-every",
        "tensorboard",  # tracking changes where the metrics also go, never the run
        "mlflow-uri",
    }
)
KEY_DIR_ENV = "PFL_KEY_DIR"  # the folder of the server's signing key (default ~/.config/pflower)
SERVER_KEY_FILE = "server.key"


@dataclass
class Checkpoint:
    """A run's state after `round` (records are the metrics.jsonl lines so far)."""

    round: int
    state: dict[str, Any]
    records: list[RoundRecord]
    elapsed_s: float = 0.0
    resumes: list[int] = field(default_factory=list)  # rounds earlier resumptions started after
    clients: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # partition -> (node, train, test)


def server_key_file() -> Path:
    """The file of the key that signs this user's checkpoints: $PFL_KEY_DIR/server.key, else ~/.config/pflower/."""
    # Not in the run folder: whoever may write there (a shared results disk, a copied run folder) must not also find
    # the key that vouches for the checkpoint. A per-user folder (0700, the key 0600) keeps it with the server's
    # user; resuming a run folder on another machine or account needs this key copied, or PFL_KEY_DIR pointed at it.
    folder = os.environ.get(KEY_DIR_ENV)
    return (Path(folder).expanduser() if folder else Path.home() / ".config" / "pflower") / SERVER_KEY_FILE


def server_key() -> bytes:
    """The key that signs this user's checkpoints, made on first use; RunAborted in one line when it cannot be."""
    try:
        return signing_key(server_key_file())
    except StateFileError as exc:
        raise RunAborted(f"cannot sign the checkpoint: {exc} (set {KEY_DIR_ENV} to a private folder)") from None


RUN_ID_FILE = "run-id"  # in the run folder: the run's random id, made at its start
RUN_ID_CHARS = 32  # hex digits
ROUNDS_FOLDER = "runs"  # beside the server's key: per run id, the last round a checkpoint was written for


def new_run_id(run_dir: Path) -> str:
    """Make the run's random id and keep it in the run folder (a new file, mode 0600); returns it."""
    run_id = secrets.token_hex(RUN_ID_CHARS // 2)
    write_new(Path(run_dir) / RUN_ID_FILE, f"{run_id}\n".encode())
    return run_id


def read_run_id(run_dir: Path) -> str:
    """The run folder's id; "" for a folder an older version made (none was kept); StateFileError when the file is
    not an id."""
    path = Path(run_dir) / RUN_ID_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise StateFileError(f"{path}: cannot be read ({exc.strerror}; a link is refused)") from None
    with os.fdopen(fd) as handle:
        text = handle.read(RUN_ID_CHARS + 2).strip()
    if len(text) != RUN_ID_CHARS or not is_hex(text):
        raise StateFileError(f"{path}: damaged (not a run id)")
    return text


def checkpoint_context(run_dir: Path, run_id: str | None = None) -> bytes:
    """What a checkpoint's signature binds it to: its run folder's name (the clients' state key) and random run id
    (`run_id` as read already, else read here), so a checkpoint copied from another run's folder, even one of the
    same name, is refused."""
    run_id = read_run_id(run_dir) if run_id is None else run_id
    name = Path(run_dir).resolve().name
    return signing_context("checkpoint", name, run_id) if run_id else signing_context("checkpoint", name)


def _rounds_file(run_id: str) -> Path:
    """Where the last checkpointed round of run `run_id` is kept: beside the server's key, out of the run folder."""
    return server_key_file().parent / ROUNDS_FOLDER / run_id


def last_checkpoint_round(run_id: str) -> int | None:
    """The round of the last checkpoint this user's server wrote for the run (None: not known here)."""
    try:
        return int(_rounds_file(run_id).read_text().strip())
    except (OSError, ValueError):
        return None


def _note_checkpoint_round(run_id: str, server_round: int) -> None:
    """Keep the round of the checkpoint just written, so an older one put back is refused on resume."""
    path = _rounds_file(run_id)
    private_folder(path.parent)
    atomic_write_text(path, f"{server_round}\n")


def save_checkpoint(run_dir: Path, checkpoint: Checkpoint) -> int:
    """Write run_dir/checkpoint.npz atomically, signed; returns its size in bytes (RunAborted without a key)."""
    tree = {
        "format": FORMAT,
        "round": checkpoint.round,
        "state": checkpoint.state,
        "records": json.dumps(checkpoint.records, sort_keys=True),
        "elapsed_s": checkpoint.elapsed_s,
        "resumes": list(checkpoint.resumes),
        # node ids are Flower's unsigned 64-bit ids: the whole table is uint64
        "clients": np.array([[pid, *row] for pid, row in sorted(checkpoint.clients.items())], np.uint64).reshape(-1, 4),
    }
    run_id = read_run_id(run_dir)
    context = checkpoint_context(run_dir, run_id)
    size = save_tree(Path(run_dir) / CHECKPOINT_FILE, tree, key=server_key(), context=context)
    if run_id:
        _note_checkpoint_round(run_id, checkpoint.round)
    return size


def load_checkpoint(run_dir: Path) -> Checkpoint:
    """The checkpoint of a run folder; StateFileError naming the file if it is missing, unreadable, not signed with
    the server's key or holds impossible values."""
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.is_file():
        raise StateFileError(
            f"{path} does not exist: the run wrote no checkpoint (checkpoint-every=0, or it "
            "stopped before its first round ended)"
        )
    try:
        key = signing_key(server_key_file(), create=False)
    except StateFileError as exc:
        raise StateFileError(f"{path}: cannot be verified: {exc} ({KEY_DIR_ENV} names the key's folder)") from None
    run_id = read_run_id(run_dir)
    try:
        tree = load_tree(path, map_from_bytes=MAP_FROM_BYTES, key=key, context=checkpoint_context(run_dir, run_id))
    except RecursionError:
        raise StateFileError(f"{path}: damaged checkpoint (nested too deeply)") from None
    if not isinstance(tree, dict) or tree.get("format") != FORMAT:
        raise StateFileError(f"{path}: unknown checkpoint format")
    try:
        checkpoint = _decoded(tree)
        rounds = [int(record["round"]) for record in checkpoint.records]
    except (KeyError, TypeError, ValueError, RecursionError) as exc:  # json's errors are ValueErrors
        raise StateFileError(f"{path}: damaged checkpoint ({type(exc).__name__}: {exc})") from None
    written = last_checkpoint_round(run_id) if run_id else None
    if written is not None and checkpoint.round < written:
        raise StateFileError(
            f"{path}: refused: it holds round {checkpoint.round}, but this run wrote a checkpoint of round {written} "
            f"({_rounds_file(run_id)}): an older checkpoint was put back"
        )
    if checkpoint.round < 1 or rounds != list(range(1, checkpoint.round + 1)) or not isinstance(checkpoint.state, dict):
        raise StateFileError(
            f"{path}: damaged checkpoint (round {checkpoint.round} with records of rounds "
            f"{rounds[:3]}{'...' if len(rounds) > 3 else ''})"
        )
    return checkpoint


def _decoded(tree: dict[str, Any]) -> Checkpoint:
    """The Checkpoint of a decoded tree; ValueError for a count that is not a whole number, a non-finite or
    negative elapsed time, or resumptions after rounds it has not reached."""
    round_ = _whole(tree["round"], "round")
    elapsed = float(tree["elapsed_s"])
    if not math.isfinite(elapsed) or elapsed < 0:
        raise ValueError(f"elapsed time {elapsed!r} s")
    resumes = [_whole(r, "resumed round") for r in tree["resumes"]]
    if resumes != sorted(resumes) or any(not 1 <= r <= round_ for r in resumes):
        raise ValueError(f"resumed after rounds {resumes[:5]} in a checkpoint of round {round_}")
    records = json.loads(str(tree["records"]))
    if not isinstance(records, list) or not all(isinstance(record, dict) for record in records):
        raise TypeError("the round records are not a list of objects")
    table = np.asarray(tree.get("clients", np.zeros((0, 4), np.uint64)))
    if table.dtype != np.uint64 or table.ndim != 2 or table.shape[1] != 4:
        raise ValueError("the clients table is not a list of (partition, node, train, test) counts")
    clients = {int(row[0]): (int(row[1]), int(row[2]), int(row[3])) for row in table}
    return Checkpoint(round_, tree["state"], cast(list[RoundRecord], records), elapsed, resumes, clients)


def _whole(value: Any, name: str) -> int:
    """`value` when it is an int (not a bool, a float or a string); ValueError naming it else."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} {value!r} is not a whole number")
    return value


def config_differences(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Run-config keys whose values differ, other than those a resumption may change."""
    keys = (set(recorded) | set(current)) - RESUMABLE_CHANGES
    return sorted(k for k in keys if recorded.get(k) != current.get(k))


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


def synced_client_states(persist: Callable[[int | None], None] | None, folder: Path) -> Callable[[int | None], None]:
    """A simulation's step before each checkpoint: `persist` (a runtime writing the client state it keeps), then
    one barrier that puts on disk every client state file written so far in `folder`'s file system (a
    simulation's clients write theirs without an fsync each: the checkpoint is what a resume goes back to, and
    every state it needs was written before it)."""

    def before_checkpoint(checkpoint_round: int | None) -> None:
        if persist is not None:
            persist(checkpoint_round)
        sync_file_system(folder)

    return before_checkpoint
