"""Seconds a round on both sides of the PFLlib side by side (`bench/pfllib_side_by_side.py time`): for each
experiment of the side by side, a few rounds of this project's in-process engine and of PFLlib, back to back on the
same clients, each measured with what else the machine ran meanwhile, so that the table's seconds a round come from
runs made alone even when the 25-round study runs that give the accuracies shared the machine.

The first round of either side warms up (worker processes, data, the model's first passes), so a timing is the
median of the later rounds. The record (round-times.json beside PFLlib's records) keeps every round's seconds, the
CPU share of each side's run, the rounds, the threads and both commits; a new timing replaces the old one of the
same experiment and side.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from common.config import ConfigError
from common.storage.persist import atomic_write_text
from common.storage.run_folder import RunFolder
from experiments.run.cpu_share import CpuMeter, CpuShare
from experiments.run.runs import RunSpec, app_commit, execute

TIMES_FILE = "round-times.json"


@dataclass(frozen=True)
class Timing:
    """One side's rounds of one experiment: each round's wall seconds and what the machine was doing meanwhile."""

    experiment: str
    side: str  # "ours" or "pfllib"
    seconds: list[float]
    cpu: CpuShare | None
    commit: str
    threads: str

    @property
    def round_seconds(self) -> float:
        """The median of the rounds after the first (the first warms up); the one round when there is one."""
        later = self.seconds[1:] or self.seconds
        return float(np.median(later)) if later else float("nan")

    @property
    def alone(self) -> bool:
        """Whether the machine ran nothing else meanwhile (experiments/run/cpu_share.py)."""
        return self.cpu is not None and self.cpu.alone

    def to_dict(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment,
            "side": self.side,
            "seconds": self.seconds,
            "cpu": None if self.cpu is None else self.cpu.to_dict(),
            "commit": self.commit,
            "threads": self.threads,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Timing:
        """A timing as the record holds it (ConfigError when it is not one)."""
        try:
            seconds = [float(s) for s in data["seconds"]]
            return cls(
                str(data["experiment"]),
                str(data["side"]),
                seconds,
                CpuShare.from_dict(data.get("cpu")),
                str(data.get("commit", "unknown")),
                str(data.get("threads", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{TIMES_FILE}: an entry that is not a timing ({exc})") from exc


def read_timings(folder: Path) -> list[Timing]:
    """The timings recorded in `folder` (none when it has no round-times.json)."""
    path = folder / TIMES_FILE
    if not path.is_file():
        return []
    data = json.loads(path.read_text())
    return [Timing.from_dict(entry) for entry in data.get("timings", [])]


def write_timings(folder: Path, new: Iterable[Timing]) -> Path:
    """Add `new` to the record, each replacing the timing of the same experiment and side."""
    fresh = list(new)
    replaced = {(t.experiment, t.side) for t in fresh}
    kept = [t for t in read_timings(folder) if (t.experiment, t.side) not in replaced]
    path = folder / TIMES_FILE
    entries = sorted([*kept, *fresh], key=lambda t: (t.experiment, t.side))
    atomic_write_text(path, json.dumps({"schema": 1, "timings": [t.to_dict() for t in entries]}, indent=1) + "\n")
    return path


def time_ours(spec: RunSpec, rounds: int, work: Path, workers: int) -> Timing:
    """`rounds` rounds of this project's in-process engine on the spec's clients."""
    from experiments.run.launchers import make_engine
    from experiments.studies.behaviour import PROJECT

    run = replace(spec, run_config={**spec.run_config, "num-rounds": rounds})
    engine = make_engine("inprocess", PROJECT, workers)
    try:
        with CpuMeter() as meter:
            result = execute(engine, PROJECT, run, work / "ours", False, lambda line: None)
    finally:
        engine.close()
    if result.status != "finished":
        raise RuntimeError(f"this project's {spec.name} {result.status}: {result.reason} (log: {result.log})")
    seconds = [float(r["wall_s"]) for r in RunFolder(result.run_dir).rounds()]
    threads = f"{workers} worker(s)" if workers else "a worker per core"
    return Timing(spec.experiment, "ours", seconds, meter.share, app_commit(PROJECT), threads)


def run_times(
    args: argparse.Namespace,
    specs: list[RunSpec],
    pfllib_run: Callable[[RunSpec, int, Path], list[float]],
    folder: Path,
    commit: str,
    commit_record: Callable[[Path, str], None] | None = None,
) -> list[Timing]:
    """Each spec timed on both sides (ours, then PFLlib's `pfllib_run`), one line each; the record written (and
    committed) after each experiment, so a stop keeps what was measured."""
    timings: list[Timing] = []
    with tempfile.TemporaryDirectory(prefix="pfllib-times-") as tmp:
        for spec in specs:
            pair = [time_ours(spec, args.rounds, Path(tmp) / spec.name, args.workers)]
            with CpuMeter() as meter:
                seconds = pfllib_run(spec, args.rounds, Path(tmp) / "pfllib")
            threads = str(args.threads) if args.threads else "torch's"
            pair.append(Timing(spec.experiment, "pfllib", seconds, meter.share, commit, threads))
            for timing in pair:
                where = "alone" if timing.alone else "NOT alone: other work ran, the table leaves it out"
                line = f"time: {spec.experiment} {timing.side}: {timing.round_seconds:.1f} s a round ({where})"
                print(line, flush=True)
            timings += pair
            path = write_timings(folder, pair)
            if commit_record is not None:
                commit_record(path, f"PFLlib side by side: seconds a round of {spec.experiment}")
    return timings


def alone_round_seconds(timings: list[Timing], experiment: str, side: str) -> list[float]:
    """The later rounds' seconds of the experiment's timings on that side made alone (the table's medians)."""
    return [s for t in timings if t.experiment == experiment and t.side == side and t.alone for s in t.seconds[1:]]


def check_rounds(rounds: int) -> int:
    """The rounds a timing takes: at least 2 (the first warms up)."""
    if rounds < 2:
        raise ConfigError(f"--rounds {rounds}: a timing needs at least 2 rounds (the first warms up)")
    return rounds
