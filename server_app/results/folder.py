"""A run's results folder: its name, config.json, metrics.jsonl (a line per round), messages.jsonl (the messages'
digests, when kept) and, at the end, summary.json, summary.md, the plots and the algorithm's artifacts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from common.config import parse_run_config
from common.persist import atomic_file, atomic_write_text

from .markdown import render_markdown
from .plots import plot_run
from .summary import summarize
from .tracking import RunTracking


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """A run folder's config.json, with the default of every key added since that run was made."""
    defaults = parse_run_config({}).to_dict()
    return {**defaults, **json.loads((Path(run_dir) / "config.json").read_text())}


def make_run_dir(base: Path, algorithm: str, dataset: str, run_name: str) -> Path:
    """A new folder under `base` named after the run (or algorithm-dataset-timestamp); never reuses one."""
    stem = run_name or f"{algorithm}-{dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = base / stem
    suffix = 1
    while path.exists():
        suffix += 1
        path = base / f"{stem}-{suffix}"
    path.mkdir(parents=True)
    return path


class ResultsWriter:
    """Writes one run's results as the run goes, so a crash loses at most the round in progress; and to the
    trackers the run config turns on (TensorBoard, MLflow)."""

    def __init__(self, run_dir: Path, config: dict[str, Any], resume: bool = False) -> None:
        self.run_dir = run_dir
        self.records: list[dict[str, Any]] = []
        atomic_write_text(run_dir / "config.json", json.dumps(config, indent=2, sort_keys=True))
        self._metrics = run_dir / "metrics.jsonl"
        self._digests = run_dir / "messages.jsonl"
        self._resume = resume
        self.tracking = RunTracking(run_dir, config)
        if not resume:
            self.tracking.open([], resumed=False)
            self._metrics.write_text("")
            self._digests.unlink(missing_ok=True)

    def restart_from(self, records: list[dict[str, Any]]) -> None:
        """Continue after the given rounds (a checkpoint's): metrics.jsonl is rewritten to hold just them,
        messages.jsonl (when the run keeps digests) just theirs, and the trackers go on after them."""
        self.records = list(records)
        atomic_write_text(self._metrics, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        self.tracking.open(self.records, resumed=True)
        if self._digests.is_file():
            last = records[-1]["round"] if records else 0
            kept = [
                line
                for line in self._digests.read_text().splitlines()
                if line.strip() and json.loads(line)["round"] <= last
            ]
            atomic_write_text(self._digests, "".join(line + "\n" for line in kept))

    def add_round(self, record: dict[str, Any], digests: list[dict[str, Any]] | None = None) -> None:
        """Append one round's record to metrics.jsonl (flushed), and its messages' digests to messages.jsonl."""
        self.records.append(record)
        with self._metrics.open("a") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
        if digests is not None:
            with self._digests.open("a") as fh:
                fh.writelines(json.dumps({"round": record["round"], **d}, sort_keys=True) + "\n" for d in digests)
        self.tracking.open([], resumed=self._resume)  # a no-op once open
        self.tracking.add_round(record)

    def finish(self, info: dict[str, Any], artifacts: dict[str, np.ndarray] | None = None) -> Path:
        """Write summary.md, the plots and the algorithm's artifacts.npz; return the summary's absolute path."""
        if artifacts:
            with atomic_file(self.run_dir / "artifacts.npz") as fh:
                np.savez(fh, allow_pickle=False, **artifacts)
        summary = summarize(self.records, info)
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True))
        path = self.run_dir / "summary.md"
        atomic_write_text(path, render_markdown(summary))
        plot_run(self.records, summary, self.run_dir)
        self.tracking.close(summary)
        return path.resolve()
