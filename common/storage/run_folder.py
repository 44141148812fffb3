"""A run's folder, declared: the files a run writes and the one reader/writer (RunFolder) every module uses for them.

A run folder holds, as the run goes: `config.json` (the run config, dashed keys), `metrics.jsonl` (one round record
a line), `messages.jsonl` (the messages' digests, when the run keeps them), `checkpoint.npz` (the server's signed
checkpoint), `client-state/` (simulated clients' state) and `run.lock` (held by its live server,
common/storage/run_lock.py); at the end `summary.json`, `summary.md`, the plots and
`artifacts.npz` (the algorithm's arrays); a sweep adds `code.json` (the commits that made it) and `cpu.json` (the
CPU seconds of its attempts and of everything else on the machine meanwhile). docs/architecture.md describes the
records.
"""

from __future__ import annotations

import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Required, TypedDict, cast

import numpy as np

from common.storage.persist import CHECKPOINT_FILE, CLIENT_STATE_FOLDER, append_text, atomic_file, atomic_write_text

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
MESSAGES_FILE = "messages.jsonl"
SUMMARY_FILE = "summary.json"
SUMMARY_MARKDOWN = "summary.md"
ARTIFACTS_FILE = "artifacts.npz"
CODE_FILE = "code.json"
CPU_FILE = "cpu.json"
RUN_FILES = (
    CONFIG_FILE,
    METRICS_FILE,
    MESSAGES_FILE,
    SUMMARY_FILE,
    SUMMARY_MARKDOWN,
    ARTIFACTS_FILE,
    CODE_FILE,
    CPU_FILE,
)

Record = dict[str, Any]  # a JSON object of the folder (the run config, a message digest)


class Evaluation(TypedDict):
    """A round's evaluation of its clients: per metric (`acc-shift-0`, ...) the mean and std over the clients."""

    num_clients: int
    failed: int
    mean: dict[str, float]
    std: dict[str, float]
    per_client: dict[str, dict[str, float]]  # partition id -> metric -> value


class FinalEvaluation(TypedDict):
    """The summary's copy of the last evaluation (without the per-client rows)."""

    mean: dict[str, float]
    std: dict[str, float]
    num_clients: int


class RoundRecord(TypedDict, total=False):
    """One line of metrics.jsonl: a round's counters, traffic, evaluation (None in a round without) and the
    algorithm's own fields (DM-PFL's phase, FedAMP's alpha_k, DapperFL's `by_ratio`, ...)."""

    round: Required[int]
    wall_s: Required[float]
    elapsed_s: Required[float]
    train: Required[dict[str, Any]]  # used, sent, loss, failed, late, rejected, flops, robust, dp, stages, ...
    bytes: Required[dict[str, int]]  # train_down, train_up, eval_down, eval_up
    bytes_per_client: Required[dict[str, dict[str, int]]]  # partition id -> up, down
    eval: Required[Evaluation | None]
    aggregate_s: float
    evaluate_s: float  # wall seconds of the round's evaluation, when it had one
    unseen: Evaluation  # the held-out clients' (newcomers') evaluation
    by_ratio: dict[str, dict[str, Any]]
    phase: int
    global_mask_density: float
    walk: dict[str, Any]  # simulation under attack-walk: the models' projection on the walkers' direction


class Summary(TypedDict, total=False):
    """summary.json: the run's settings, its final and best accuracies, costs and reply counts."""

    algorithm: str
    dataset: str
    partition: str
    seed: int
    num_clients: int
    shift_degrees: list[float]
    resumed_after_rounds: list[int]
    stopped_early: dict[str, Any]
    rounds_completed: int
    final_round: int | None
    final: FinalEvaluation | None
    best_mean_accuracy: float
    best_round: int | None
    bytes_total: dict[str, int]
    mb_per_client: dict[str, float]
    train_flops_total: float
    train_flops_per_client: float
    train_flops_dense_grad_total: float
    train_flops_dense_grad_per_client: float
    replies_used: list[int]
    replies_sent: list[int]
    replies_failed: list[int]
    replies_late: list[int]
    replies_rejected: list[int]
    wall_seconds: float
    aggregate_s_median: float | None
    robust: dict[str, Any]
    peer_bound: dict[str, Any]  # run-config max-update-ratio: its ratio and the updates it shortened, all rounds
    dp: dict[str, Any]  # central DP: epsilon at delta spent, noise multiplier, clip bound, clipped updates
    by_ratio: dict[str, dict[str, Any]]
    unseen: Evaluation
    stages: dict[str, Any]
    stages_round: int


def evaluation(record: RoundRecord) -> Evaluation | None:
    """A round's evaluation of its clients; None in a round without evaluation."""
    return record.get("eval") or None


def final_evaluation(summary: Summary) -> FinalEvaluation | None:
    """The run's last evaluation; None when it never evaluated."""
    return summary.get("final") or None


def unseen_evaluation(summary: Summary) -> Evaluation | None:
    """The held-out clients' (newcomers') last evaluation; None when the run has none."""
    return summary.get("unseen") or None


def _stat(found: Evaluation | FinalEvaluation | None, stat: Literal["mean", "std"]) -> dict[str, float]:
    return dict(found[stat]) if found else {}


def evaluation_means(record: RoundRecord) -> dict[str, float]:
    """A round's mean over clients per evaluation metric; empty in a round without evaluation."""
    return _stat(evaluation(record), "mean")


def evaluated_clients(record: RoundRecord) -> int:
    """How many clients a round evaluated (0 in a round without evaluation)."""
    found = evaluation(record)
    return int(found["num_clients"]) if found else 0


def final_means(summary: Summary) -> dict[str, float]:
    """The last evaluation's mean over clients per metric; empty when the run never evaluated."""
    return _stat(final_evaluation(summary), "mean")


def final_stds(summary: Summary) -> dict[str, float]:
    """The last evaluation's std over clients per metric; empty when the run never evaluated."""
    return _stat(final_evaluation(summary), "std")


def unseen_means(summary: Summary) -> dict[str, float]:
    """The held-out clients' (newcomers') last evaluation: mean per metric; empty when the run has none."""
    return _stat(unseen_evaluation(summary), "mean")


def _json_lines(path: Path) -> list[Record]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def write_run_record(path: Path, record: Record) -> None:
    """Write a study's run record (experiments/studies/records.py) as gzipped JSON, atomically: sorted keys and no
    timestamp in the gzip header, so the same record is always the same bytes."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0, compresslevel=9) as fh:
        fh.write(json.dumps(record, sort_keys=True, separators=(",", ":")).encode())
    with atomic_file(Path(path)) as out:
        out.write(buffer.getvalue())


MAX_RECORD_BYTES = 64 << 20  # unpacked: a record is ~100 KB; a larger one is refused, not read into memory


def read_run_record(path: Path) -> Record:
    """A run record written by write_run_record (ValueError when it unpacks to more than MAX_RECORD_BYTES)."""
    with gzip.open(Path(path), "rb") as fh:
        raw = fh.read(MAX_RECORD_BYTES + 1)
    if len(raw) > MAX_RECORD_BYTES:
        raise ValueError(f"it unpacks to more than {MAX_RECORD_BYTES} bytes")
    return dict(json.loads(raw))


@dataclass(frozen=True)
class RunFolder:
    """One run's folder: where each of its files lies, whether the run finished, and its records read or written."""

    path: Path

    def file(self, name: str) -> Path:
        """The path of one of the folder's files (a name of RUN_FILES, CHECKPOINT_FILE or CLIENT_STATE_FOLDER)."""
        return Path(self.path) / name

    @property
    def config_path(self) -> Path:
        return self.file(CONFIG_FILE)

    @property
    def metrics_path(self) -> Path:
        return self.file(METRICS_FILE)

    @property
    def messages_path(self) -> Path:
        return self.file(MESSAGES_FILE)

    @property
    def summary_path(self) -> Path:
        return self.file(SUMMARY_FILE)

    @property
    def checkpoint_path(self) -> Path:
        return self.file(CHECKPOINT_FILE)

    @property
    def client_state_path(self) -> Path:
        return self.file(CLIENT_STATE_FOLDER)

    def is_run(self) -> bool:
        """Whether the folder is a run's (it has its config)."""
        return self.config_path.is_file()

    def finished(self) -> bool:
        """Whether the run wrote its summary (it ran to its end)."""
        return self.summary_path.is_file()

    def resumable(self) -> bool:
        """Whether a server checkpoint is there to resume from."""
        return self.checkpoint_path.is_file()

    def config(self) -> Record:
        """The run config as the run saved it (dashed keys; a key added since is absent)."""
        return dict(json.loads(self.config_path.read_text()))

    def summary(self) -> Summary:
        """The finished run's summary."""
        return cast(Summary, dict(json.loads(self.summary_path.read_text())))

    def rounds(self) -> list[RoundRecord]:
        """The round records so far, in round order (empty before the first)."""
        return cast(list[RoundRecord], _json_lines(self.metrics_path))

    def digests(self) -> list[Record]:
        """The messages' digests so far (empty when the run keeps none)."""
        return _json_lines(self.messages_path)

    def artifacts(self) -> dict[str, np.ndarray]:
        """The algorithm's arrays (attention, mask overlap, ...), empty when it left none; nothing is unpickled."""
        if not self.file(ARTIFACTS_FILE).is_file():
            return {}
        with np.load(self.file(ARTIFACTS_FILE), allow_pickle=False) as z:
            return {key: z[key] for key in z.files}

    def commits(self) -> list[str]:
        """The commits a sweep recorded as having made the run (empty when none was, or the record is unreadable)."""
        try:
            commits = json.loads(self.file(CODE_FILE).read_text()).get("commits", [])
        except (OSError, ValueError, AttributeError):
            return []
        return [str(c) for c in commits] if isinstance(commits, list) else []

    def write_commits(self, commits: list[str]) -> None:
        """Save the commits that made the run, in the order its attempts ran."""
        atomic_write_text(self.file(CODE_FILE), json.dumps({"commits": commits}) + "\n")

    def cpu(self) -> Record | None:
        """The CPU seconds a sweep measured over the run's attempts (experiments/run/cpu_share.py), or None."""
        try:
            data = json.loads(self.file(CPU_FILE).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def write_cpu(self, cpu: Record) -> None:
        """Save the CPU seconds measured over the run's attempts."""
        atomic_write_text(self.file(CPU_FILE), json.dumps(cpu) + "\n")

    def write_config(self, config: Record) -> None:
        """Save the run config (atomically)."""
        atomic_write_text(self.config_path, json.dumps(config, indent=2, sort_keys=True))

    def write_rounds(self, records: list[RoundRecord]) -> None:
        """Replace the round records by these (atomically): a new run's none, a resumed run's checkpointed ones."""
        atomic_write_text(self.metrics_path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))

    def append_round(self, record: RoundRecord) -> None:
        """Add one round's record (flushed at once: a crash loses at most the round in progress)."""
        append_text(self.metrics_path, json.dumps(record, sort_keys=True) + "\n")

    def write_digests(self, records: list[Record]) -> None:
        """Replace the messages' digests by these (atomically)."""
        atomic_write_text(self.messages_path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))

    def append_digests(self, records: list[Record]) -> None:
        """Add one round's messages' digests."""
        append_text(self.messages_path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))

    def write_summary(self, summary: Summary, markdown: str) -> Path:
        """Save the summary and its markdown rendering (atomically); returns the markdown's path."""
        atomic_write_text(self.summary_path, json.dumps(summary, indent=2, sort_keys=True))
        path = self.file(SUMMARY_MARKDOWN)
        atomic_write_text(path, markdown)
        return path

    def write_artifacts(self, artifacts: dict[str, np.ndarray]) -> None:
        """Save the algorithm's arrays (atomically)."""
        with atomic_file(self.file(ARTIFACTS_FILE)) as fh:
            np.savez(fh, allow_pickle=False, **artifacts)
