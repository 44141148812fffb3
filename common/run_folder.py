"""A run's folder, declared: the files a run writes and the one reader/writer (RunFolder) every module uses for them.

A run folder holds, as the run goes: `config.json` (the run config, dashed keys), `metrics.jsonl` (one round record
a line), `messages.jsonl` (the messages' digests, when the run keeps them), `checkpoint.npz` (the server's signed
checkpoint) and `client-state/` (simulated clients' state); at the end `summary.json`, `summary.md`, the plots and
`artifacts.npz` (the algorithm's arrays); a sweep adds `code.json` (the commits that made it). docs/architecture.md
describes the records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .persist import CHECKPOINT_FILE, CLIENT_STATE_FOLDER, atomic_file, atomic_write_text

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
MESSAGES_FILE = "messages.jsonl"
SUMMARY_FILE = "summary.json"
SUMMARY_MARKDOWN = "summary.md"
ARTIFACTS_FILE = "artifacts.npz"
CODE_FILE = "code.json"
RUN_FILES = (CONFIG_FILE, METRICS_FILE, MESSAGES_FILE, SUMMARY_FILE, SUMMARY_MARKDOWN, ARTIFACTS_FILE, CODE_FILE)

Record = dict[str, Any]  # a round record (a line of metrics.jsonl) or the summary: JSON objects


def _json_lines(path: Path) -> list[Record]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


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

    def summary(self) -> Record:
        """The finished run's summary."""
        return dict(json.loads(self.summary_path.read_text()))

    def rounds(self) -> list[Record]:
        """The round records so far, in round order (empty before the first)."""
        return _json_lines(self.metrics_path)

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
        self.file(CODE_FILE).write_text(json.dumps({"commits": commits}) + "\n")

    def write_config(self, config: Record) -> None:
        """Save the run config (atomically)."""
        atomic_write_text(self.config_path, json.dumps(config, indent=2, sort_keys=True))

    def write_rounds(self, records: list[Record]) -> None:
        """Replace the round records by these (atomically): a new run's none, a resumed run's checkpointed ones."""
        atomic_write_text(self.metrics_path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))

    def append_round(self, record: Record) -> None:
        """Add one round's record (flushed at once: a crash loses at most the round in progress)."""
        with self.metrics_path.open("a") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")

    def write_digests(self, records: list[Record]) -> None:
        """Replace the messages' digests by these (atomically)."""
        atomic_write_text(self.messages_path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))

    def append_digests(self, records: list[Record]) -> None:
        """Add one round's messages' digests."""
        with self.messages_path.open("a") as fh:
            fh.writelines(json.dumps(r, sort_keys=True) + "\n" for r in records)

    def write_summary(self, summary: Record, markdown: str) -> Path:
        """Save the summary and its markdown rendering (atomically); returns the markdown's path."""
        atomic_write_text(self.summary_path, json.dumps(summary, indent=2, sort_keys=True))
        path = self.file(SUMMARY_MARKDOWN)
        atomic_write_text(path, markdown)
        return path

    def write_artifacts(self, artifacts: dict[str, np.ndarray]) -> None:
        """Save the algorithm's arrays (atomically)."""
        with atomic_file(self.file(ARTIFACTS_FILE)) as fh:
            np.savez(fh, allow_pickle=False, **artifacts)
