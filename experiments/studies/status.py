"""Where a study stands: for each run of a sweep file, its record is current (today's code gives the same behaviour
hash for its config), stale (the code has changed what that config does), made with other settings than the file
now asks, or missing; with each owed run's estimated hours (the records' own wall times)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.hparams import ConfigError
from experiments.run.runs import RunSpec, settings_differ
from experiments.run.sweep import Sweep
from experiments.studies.behaviour import FAILED, behaviour_hashes, cases_of
from experiments.studies.records import read_records, records_folder
from experiments.studies.tiny import tiny_key

GPU_HOURS = 3.0  # a run estimated longer than this on these cores is listed as needing a GPU, never started
PRESET_HOURS = {"smoke": 0.01, "quickstart": 0.02, "cpu": 0.1, "paper": 1.0}  # without a record or `hours`

Hasher = Callable[[dict[str, tuple[dict[str, Any], int]]], dict[str, str]]


@dataclass
class RunState:
    """One run of a study: its state ('current', 'stale', 'other settings', 'missing'), why, and the hours a run
    of it is estimated to take here."""

    spec: RunSpec
    state: str
    why: str = ""
    hours: float = 0.0
    record: dict[str, Any] | None = None

    tier: int = 3

    @property
    def owed(self) -> bool:
        """Whether the run still has to be made (missing, stale or made with other settings)."""
        return self.state in ("missing", "stale", "other settings")

    @property
    def needs_gpu(self) -> bool:
        """Whether its estimate is past what one session of these cores can run."""
        return self.owed and self.hours > GPU_HOURS


@dataclass
class StudyState:
    """Every run of one sweep file and where its records are."""

    sweep_file: Path
    sweep: Sweep
    folder: Path
    runs: list[RunState] = field(default_factory=list)

    def count(self, state: str) -> int:
        """How many runs are in this state."""
        return sum(r.state == state for r in self.runs)

    @property
    def owed_hours(self) -> float:
        """Hours of the owed runs that these cores can make (GPU-only ones aside)."""
        return sum(r.hours for r in self.runs if r.owed and not r.needs_gpu)


def _estimate(spec: RunSpec, records: dict[str, dict[str, Any]], hours: dict[str, float]) -> float:
    """A run's hours here: the median wall time of its experiment's records made without a GPU, else the sweep
    file's `hours` for it, else its preset's guess."""
    walls = [
        float(r.get("wall_seconds", 0.0)) / 3600
        for r in records.values()
        if r.get("experiment") == spec.experiment and not r.get("machine", {}).get("gpu")
    ]
    if walls:
        return statistics.median(walls)
    return hours.get(spec.experiment, PRESET_HOURS.get(spec.preset.name, 1.0))


def study_state(
    sweep_file: Path,
    sweep: Sweep,
    hasher: Hasher | None = None,
    folder: Path | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> StudyState:
    """Every run of the sweep with its record's state (behaviour hashes from `hasher`, default: today's code)."""
    folder = folder or records_folder(sweep_file, sweep.name)
    records = read_records(folder)
    hasher = hasher or (lambda cases: behaviour_hashes(cases, say=say))
    items = [(r["config"], int(r["clients"])) for r in records.values()]
    hashes = hasher(cases_of(items)) if items else {}
    study = StudyState(sweep_file, sweep, folder)
    for spec in sweep.specs:
        record = records.get(spec.name)
        hours = _estimate(spec, records, sweep.hours)
        if record is None:
            study.runs.append(RunState(spec, "missing", "no record", hours))
            continue
        differ = settings_differ(spec.run_config, record["config"])
        if differ:
            study.runs.append(RunState(spec, "other settings", "; ".join(differ[:3]), hours, record))
            continue
        try:
            today = hashes.get(tiny_key(record["config"], int(record["clients"])), f"{FAILED}: not hashed")
        except ConfigError as exc:
            today = f"{FAILED}: {exc}"
        if today.startswith(FAILED):
            study.runs.append(
                RunState(spec, "stale", f"today's code cannot make its tiny run ({today})", hours, record)
            )
        elif today != record["behaviour"]:
            why = f"behaviour {record['behaviour']} then, {today} now"
            study.runs.append(RunState(spec, "stale", why, hours, record))
        else:
            study.runs.append(RunState(spec, "current", "", hours, record))
    for run in study.runs:
        run.tier = sweep.tiers.get(run.spec.experiment, 3)
    return study


def _clock(hours: float) -> str:
    minutes = int(round(hours * 60))
    return f"{minutes // 60}h{minutes % 60:02d}m"


def check_lines(study: StudyState) -> list[str]:
    """What `pflower results --check` says of one study: its counts, then each owed run with its hours."""
    total = len(study.runs)
    gpu = [r for r in study.runs if r.needs_gpu]
    lines = [
        f"{study.sweep_file}: {study.count('current')} of {total} runs current, {study.count('stale')} stale, "
        f"{study.count('other settings')} made with other settings, {study.count('missing')} missing; "
        f"~{_clock(study.owed_hours)} owed on these cores" + (f", {len(gpu)} needing a GPU" if gpu else "")
    ]
    for run in study.runs:
        if run.owed:
            where = "needs a GPU" if run.needs_gpu else f"~{_clock(run.hours)}"
            lines.append(f"  {run.spec.name}: {run.state} ({where}){': ' + run.why if run.why else ''}")
    return lines


def tier_lines(studies: list[StudyState]) -> list[str]:
    """Per tier: runs current of all, hours owed here, runs needing a GPU."""
    lines = []
    for tier in sorted({r.tier for s in studies for r in s.runs}):
        runs = [r for s in studies for r in s.runs if r.tier == tier]
        current = sum(r.state == "current" for r in runs)
        hours = sum(r.hours for r in runs if r.owed and not r.needs_gpu)
        gpu = sum(r.needs_gpu for r in runs)
        state = "current and complete" if current == len(runs) else f"~{_clock(hours)} owed on these cores"
        lines.append(
            f"tier {tier}: {current} of {len(runs)} runs current; {state}" + (f", {gpu} needing a GPU" if gpu else "")
        )
    return lines
