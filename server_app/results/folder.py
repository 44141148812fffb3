"""A run's results as the run goes: its folder's name, its config, a record per round, the messages' digests (when
kept) and, at the end, the summary, its markdown, the plots and the algorithm's artifacts (common/storage/run_folder.py
declares the files)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from common.config import parse_run_config
from common.storage.persist import PRIVATE_FOLDER, private_folder
from common.storage.run_folder import RoundRecord, RunFolder

from .markdown import render_markdown
from .plots import plot_run
from .summary import summarize
from .tracking import RunTracking


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """A run folder's saved config, with the default of every key added since that run was made."""
    defaults = parse_run_config({}).to_dict()
    return {**defaults, **RunFolder(Path(run_dir)).config()}


def make_run_dir(base: Path, algorithm: str, dataset: str, run_name: str) -> Path:
    """A new folder under `base` named after the run (or algorithm-dataset-timestamp); never reuses one."""
    stem = run_name or f"{algorithm}-{dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
    private_folder(base)
    path, suffix = base / stem, 1
    while True:
        try:
            path.mkdir(mode=PRIVATE_FOLDER)  # another local user can neither list nor read the run's files
        except FileExistsError:  # an earlier run's, or one another server made this instant
            suffix += 1
            path = base / f"{stem}-{suffix}"
            continue
        return path


class ResultsWriter:
    """Writes one run's results as the run goes, so a crash loses at most the round in progress; and to the
    trackers the run config turns on (TensorBoard, MLflow)."""

    def __init__(self, run_dir: Path, config: dict[str, Any], resume: bool = False) -> None:
        self.run_dir = run_dir
        self.folder = RunFolder(run_dir)
        self.records: list[RoundRecord] = []
        self.folder.write_config(config)
        self._resume = resume
        self.tracking = RunTracking(run_dir, config)
        if not resume:
            self.tracking.open([], resumed=False)
            self.folder.write_rounds([])
            self.folder.messages_path.unlink(missing_ok=True)

    def restart_from(self, records: list[RoundRecord]) -> None:
        """Continue after the given rounds (a checkpoint's): the round records are rewritten to hold just them, the
        messages' digests (when the run keeps them) just theirs, and the trackers go on after them."""
        self.records = list(records)
        self.folder.write_rounds(self.records)
        self.tracking.open(self.records, resumed=True)
        if self.folder.messages_path.is_file():
            last = records[-1]["round"] if records else 0
            self.folder.write_digests([d for d in self.folder.digests() if d["round"] <= last])

    def add_round(self, record: RoundRecord, digests: list[dict[str, Any]] | None = None) -> None:
        """Append one round's record (flushed), and its messages' digests."""
        self.records.append(record)
        self.folder.append_round(record)
        if digests is not None:
            self.folder.append_digests([{"round": record["round"], **d} for d in digests])
        self.tracking.open([], resumed=self._resume)  # a no-op once open
        self.tracking.add_round(record)

    def finish(self, info: dict[str, Any], artifacts: dict[str, np.ndarray] | None = None) -> Path:
        """Write the summary and its markdown, the plots and the algorithm's artifacts; return the markdown's absolute
        path."""
        if artifacts:
            self.folder.write_artifacts(artifacts)
        summary = summarize(self.records, info)
        path = self.folder.write_summary(summary, render_markdown(summary))
        plot_run(self.records, summary, self.run_dir)
        self.tracking.close(summary)
        return path.resolve()
