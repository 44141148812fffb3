"""Finished run folders found under given paths, grouped by experiment (the run folder's name without its seed)."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from common import stopping
from common.hparams import ConfigError
from common.storage.run_folder import (
    ARTIFACTS_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    SUMMARY_FILE,
    RoundRecord,
    RunFolder,
    Summary,
    evaluation_means,
    final_evaluation,
    final_means,
    final_stds,
)
from experiments.run.cpu_share import CpuShare

SUPERSEDED = "superseded"  # run folders set aside by a sweep (experiments/run/runs.SUPERSEDED_FOLDER): not reported
CORRUPT = re.compile(r"^acc-corrupt-(.+)-(\d)$")
SEED_SUFFIX = re.compile(r"-seed(\d+)$")
NOT_SETTINGS = {"seed", "run-name", "results-dir", "resume", "data-dir", "client-state-dir"}
# Keys that say how or where a run ran, not what it measured: runs differing only in these are comparable.
NOT_EXPERIMENT = NOT_SETTINGS | {
    "algorithm",
    "allow-download",
    "checkpoint-every",
    "client-threads",
    "device",
    "message-digests",
    "messages-in-flight",
    "mlflow-uri",
    "round-timeout",
    "takeover",
    "takeover-after",
    "tensorboard",
}
# The words a settings header uses for the common keys (others appear as `key=value`).
SETTING_WORDS = {"clients": "clients", "num-rounds": "rounds", "local-epochs": "epochs", "batch-size": "batch"}


@dataclass
class Run:
    """A finished run: folder, config, summary and round records."""

    path: Path
    config: dict[str, Any]
    summary: Summary
    records: list[RoundRecord]
    arrays: dict[str, np.ndarray] | None = None  # a run record's arrays (None: read them from the run folder)
    commits: list[str] | None = None  # a run record's commits (None: the run folder's code.json)
    current: bool = True  # a run record made by code that still behaves the same (experiments/studies)
    finished: str = ""  # a run record's finishing time (ISO); a run folder's is its summary's time
    machine: str = ""  # a run record's machine in words; a run folder's is this one
    cpu: CpuShare | None = None  # how much of the machine the run had (None: not measured)

    @property
    def seed(self) -> int:
        """The run's seed."""
        return int(self.config.get("seed", 0))

    @property
    def final(self) -> dict[str, float]:
        """Mean across clients of every metric of the last evaluation."""
        return final_means(self.summary)

    @property
    def final_std(self) -> dict[str, float]:
        """Std across clients of every metric of the last evaluation."""
        return final_stds(self.summary)

    @property
    def mb_per_client(self) -> float:
        """Training MB down + up per client over the run (measured)."""
        mb = self.summary.get("mb_per_client", {})
        return float(mb.get("train_down", 0.0) + mb.get("train_up", 0.0))

    @property
    def mb_all_per_client(self) -> float:
        """Training and evaluation MB down + up per client over the run (measured)."""
        mb = self.summary.get("mb_per_client", {})
        return float(sum(mb.get(k, 0.0) for k in ("train_down", "train_up", "eval_down", "eval_up")))

    @property
    def flops_per_client(self) -> float:
        """Training FLOPs per client over the run."""
        return float(self.summary.get("train_flops_per_client", 0.0))

    @property
    def flops_dense_grad_per_client(self) -> float:
        """Training FLOPs per client over the run with whole weight gradients of masked layers (a run from before
        that count: its FLOPs)."""
        return float(self.summary.get("train_flops_dense_grad_per_client", self.flops_per_client))

    def best_round(self) -> dict[str, float]:
        """Mean metrics of the evaluation round with the best mean accuracy at shift 0 (the papers' best-round
        accuracy): the round summary.json's `best_round` and the stop rule name."""
        best = stopping.best_round(stopping.accuracy_curve(self.records))
        return next((evaluation_means(r) for r in self.records if r["round"] == best), {})

    def artifacts(self) -> dict[str, np.ndarray]:
        """The arrays the algorithm left (attention, mask overlap), empty when none."""
        return self.arrays if self.arrays is not None else RunFolder(self.path).artifacts()


@dataclass
class Group:
    """The runs of one experiment, one per seed."""

    label: str
    runs: list[Run] = field(default_factory=list)
    stale: int = 0  # of its runs, those made by code that has changed what they do since (run records)

    @property
    def config(self) -> dict[str, Any]:
        """The settings the runs share (those of the first)."""
        return self.runs[0].config

    @property
    def algorithm(self) -> str:
        """The experiment's algorithm."""
        return str(self.config.get("algorithm", "?"))

    @property
    def settings(self) -> dict[str, Any]:
        """What defines the experiment apart from its algorithm (see `experiment_settings`)."""
        return experiment_settings(self.runs[0])

    def by_seed(self, value: Any) -> dict[int, float]:
        """seed -> value(run) for the runs where it is a finite number."""
        out = {}
        for run in self.runs:
            got = value(run)
            if isinstance(got, (int, float)) and math.isfinite(got):
                out[run.seed] = float(got)
        return out


# What reading a damaged file raises: a cut JSON line or bytes that are not UTF-8 (ValueError), a cut archive
# (BadZipFile, EOFError), a file that cannot be opened (OSError).
DAMAGE = (OSError, ValueError, TypeError, KeyError, EOFError, zipfile.BadZipFile)


def _load(path: Path) -> Run:
    folder = RunFolder(path)
    return Run(path, folder.config(), folder.summary(), folder.rounds(), cpu=CpuShare.from_dict(folder.cpu()))


def run_damage(path: Path) -> str | None:
    """What makes a finished run folder unreadable, as 'FILE: what' (None: its config, summary, round records and
    arrays all read and have their shape)."""
    folder = RunFolder(path)

    def rounds_read() -> bool:  # a finished run recorded at least one round
        records = folder.rounds()
        return bool(records) and all(isinstance(r, dict) and isinstance(r.get("round"), int) for r in records)

    checks: list[tuple[str, Any]] = [
        (CONFIG_FILE, lambda: isinstance(json.loads(folder.config_path.read_text()), dict)),
        (SUMMARY_FILE, lambda: isinstance(json.loads(folder.summary_path.read_text()), dict)),
        (METRICS_FILE, rounds_read),
        (ARTIFACTS_FILE, lambda: isinstance(folder.artifacts(), dict)),
    ]
    for name, reads in checks:
        try:
            if not reads():
                return f"{name}: not what a run writes"
        except DAMAGE as exc:
            text = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
            return f"{name}: unreadable ({text})"
    return None


def _say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def find_runs(paths: list[Path], say: Callable[[str], None] = _say_on_stderr, required: bool = True) -> list[Run]:
    """Every finished run folder (holding its summary) at or below the given paths, in path order; a damaged one is
    skipped with one line to `say` naming the file and the damage (ConfigError when none is left and `required`)."""
    found: list[Path] = []
    for path in paths:
        path = Path(path).expanduser()
        if not path.exists():
            raise ConfigError(f"{path} does not exist")
        candidates = (
            [path]
            if RunFolder(path).finished()
            else sorted(p.parent for p in path.rglob(SUMMARY_FILE) if not {"incomplete", SUPERSEDED} & set(p.parts))
        )
        found.extend(c for c in candidates if c not in found)
    if not found:
        raise ConfigError(f"no finished run (a folder with {SUMMARY_FILE}) under {', '.join(map(str, paths))}")
    runs = []
    for folder in found:
        if (damage := run_damage(folder)) is not None:
            say(f"skipped: {folder}: {damage}")
            continue
        runs.append(_load(folder))
    if not runs and required:
        raise ConfigError(f"every finished run under {', '.join(map(str, paths))} is damaged (see the lines above)")
    return runs


@functools.cache
def _defaults() -> dict[str, Any]:
    """Every run-config key's default, as config.json writes it (tuples as lists)."""
    from common.config import known_keys

    return json.loads(json.dumps(known_keys()))


def _setting(config: dict[str, Any], key: str) -> Any:
    """A run's value of a key; a key its config.json lacks (written before the key existed) has the key's default,
    which is what that code did."""
    return config[key] if key in config else _defaults().get(key)


def _conflict(runs: list[Run]) -> str | None:
    """Why these runs cannot be one experiment's seeds (settings that differ, a seed twice); None when they can."""
    first = runs[0]
    seen: dict[int | None, Run] = {}
    for run in runs:
        differ = sorted(
            k
            for k in set(run.config) | set(first.config)
            if k not in NOT_SETTINGS and _setting(run.config, k) != _setting(first.config, k)
        )
        if differ:
            return f"{run.path} and {first.path} differ in {differ[:5]}"
        if run.seed in seen:
            return f"{run.path} and {seen[run.seed].path} have the same seed {run.seed}"
        seen[run.seed] = run
    return None


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs grouped by experiment name (run folder name without '-seedN'). Runs of one name that cannot be one
    experiment (other settings, a seed twice) but sit in different folders, such as two sweeps' results side by side,
    are grouped by folder too ('<folder>/<name>'); within one folder they must share settings."""
    by_name: dict[str, list[Run]] = {}
    for run in runs:
        by_name.setdefault(SEED_SUFFIX.sub("", run.path.name), []).append(run)
    groups: list[Group] = []
    for name, members in by_name.items():
        parts: dict[str, list[Run]] = {name: members}
        parents = sorted({run.path.parent for run in members})
        if _conflict(members) and len(parents) > 1:
            root = Path(os.path.commonpath(parents))
            parts = {}
            for run in members:
                folder = run.path.parent.relative_to(root).as_posix()
                parts.setdefault(f"{run.path.parent.name if folder == '.' else folder}/{name}", []).append(run)
        for label, part in parts.items():
            reason = _conflict(part)
            if reason:
                raise ConfigError(f"the runs of '{label}' are not one experiment: {reason}")
            groups.append(Group(label, part))
    return groups


def _algorithm_keys() -> set[str]:
    from dataclasses import fields

    from common.algorithms import param_classes

    return {f.name.replace("_", "-") for cls in param_classes() for f in fields(cls)}


def experiment_settings(run: Run) -> dict[str, Any]:
    """The run's settings that define an experiment: every run-config key but the algorithm and its own keys, the
    seed, names and folders, and the engine's performance keys (NOT_EXPERIMENT); plus the number of clients."""
    ignored = NOT_EXPERIMENT | _algorithm_keys()
    settings = {k: v for k, v in sorted(run.config.items()) if k not in ignored}
    final = final_evaluation(run.summary)
    settings["clients"] = run.summary.get("num_clients", final.get("num_clients") if final else None)
    return settings


def by_settings(groups: list[Group]) -> list[list[Group]]:
    """Experiments grouped by their settings (first-seen order): only those within one list are comparable."""
    found: list[tuple[dict[str, Any], list[Group]]] = []
    for group in groups:
        settings = group.settings
        for known, members in found:
            if known == settings:
                members.append(group)
                break
        else:
            found.append((settings, [group]))
    return [members for _, members in found]


def _setting_text(key: str, value: Any) -> str:
    if isinstance(value, list):
        value = ",".join(map(str, value))
    return f"{value} {SETTING_WORDS[key]}" if key in SETTING_WORDS else f"{key}={value}"


def settings_text(settings: dict[str, Any], keys: list[str]) -> str:
    """The settings under `keys` in words: '10 clients, 20 rounds' (dataset and partition by their value)."""
    words = []
    for key in keys:
        value = settings.get(key)
        words.append(str(value) if key in ("dataset", "partition") else _setting_text(key, value))
    return ", ".join(words)


def distinguishing_keys(setting_groups: list[list[Group]]) -> list[str]:
    """The settings keys whose values differ between the settings groups (data set, partition, clients first)."""
    all_settings = [members[0].settings for members in setting_groups]
    keys = sorted({k for s in all_settings for k in s if len({repr(t.get(k)) for t in all_settings}) > 1})
    first = [k for k in ("dataset", "partition", "clients", "num-rounds") if k in keys]
    return first + [k for k in keys if k not in first]


def corruptions_of(groups: list[Group]) -> dict[str, list[int]]:
    """Corruption name -> severities found in the runs' final metrics."""
    found: dict[str, set[int]] = {}
    for g in groups:
        for run in g.runs:
            for key in run.final:
                match = CORRUPT.match(key)
                if match:
                    found.setdefault(match.group(1), set()).add(int(match.group(2)))
    return {name: sorted(sev) for name, sev in sorted(found.items())}
