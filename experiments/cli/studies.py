"""`pflower sweep FILE... --budget B [--commit]`: the owed runs of study files within a budget, each finished run's
record landed (experiments/studies)."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from fnmatch import fnmatchcase
from pathlib import Path

from common.hparams import ConfigError
from experiments.run.launchers import Engine, make_engine
from experiments.run.output import for_terminal
from experiments.run.runs import RunResult, changed_settings, drop_resume_state, execute, run_state
from experiments.run.runs import set_aside as set_aside_folder
from experiments.run.sweep import Sweep, narrow, only_names, read_sweep, shard
from experiments.studies.behaviour import code_digest
from experiments.studies.budgeted import budget_plan, land_record, parse_budget, run_budgeted, set_aside
from experiments.studies.status import RunState, StudyState, check_lines, study_state

from .parser import PROJECT


def say(line: str) -> None:
    """One line of the budgeted sweep's progress, at once."""
    print(line, flush=True)


def only_patterns(only: list[str] | None, sweeps: dict[Path, Sweep]) -> dict[Path, list[str]] | None:
    """Per sweep file, the --only names and globs that name an experiment of it (None without --only); with
    several files each must name one of some file (ConfigError naming those that name none)."""
    if not only:
        return None
    patterns = only_names(",".join(only))
    if len(sweeps) == 1:
        return {file: patterns for file in sweeps}  # narrow() says which name matches nothing, listing the names
    names = {file: {spec.experiment for spec in sweep.specs} for file, sweep in sweeps.items()}
    found = {file: [p for p in patterns if any(fnmatchcase(n, p) for n in names[file])] for file in sweeps}
    if unmatched := [p for p in patterns if not any(p in f for f in found.values())]:
        raise ConfigError(f"--only: {', '.join(unmatched)} names no experiment of the sweep files given")
    return found


def budgeted_sweep(args: argparse.Namespace) -> int:
    """Run what fits of the owed runs of every file given; exit 0 unless a run failed."""
    from experiments.run.preflight import check_engine_installed, check_runs

    budget = parse_budget(args.budget)
    if args.list and args.commit:
        raise ConfigError("--list runs nothing, so it has nothing to --commit: give one of them")
    if args.out and len(args.file) > 1:
        raise ConfigError("--out names one sweep's results folder: give one sweep file with it")
    studies: list[StudyState] = []
    sweeps = {file: read_sweep(file) for file in args.file}
    patterns = only_patterns(args.only, sweeps)
    for file, sweep in sweeps.items():
        if patterns is not None:
            if not patterns[file]:
                continue  # none of the --only experiments is this file's
            sweep = narrow(sweep, ",".join(patterns[file]))
        if args.shard:
            sweep = replace(sweep, specs=shard(sweep.specs, args.shard))
        studies.append(study_state(file, sweep, say=say))
    for study in studies:
        for line in check_lines(study):
            say(line)
    outs = {id(s): Path(args.out or Path("results") / s.sweep.name).expanduser().resolve() for s in studies}
    export = args.data_export.expanduser().resolve() if args.data_export else None
    for study in studies:
        for run in study.runs:
            folder = run_state(outs[id(study)] / run.spec.name)
            if folder in ("finished", "resumable", "incomplete") and changed_settings(
                run.spec, outs[id(study)] / run.spec.name
            ):  # made with other settings than the file now asks: finished or not, it is made again
                if args.list:
                    say(f"budget: the run folder of {run.spec.name} was made with other settings: would be made again")
                    continue
                set_aside_folder(outs[id(study)] / run.spec.name)
                say(f"budget: the run folder of {run.spec.name} was made with other settings: set aside, made again")
            elif run.state == "missing" and folder == "finished":
                run.hours = 0.0  # made already (a run folder without a record, e.g. from a GPU machine): landed now
            elif run.owed and folder == "running":
                run.state = "running elsewhere"  # another sweep's server holds its folder: not this sweep's to run
                say(f"budget: {run.spec.name} is running in another sweep: left to it")
    for study in studies:
        owed = [r.spec for r in study.runs if r.owed and not r.needs_gpu]
        check_engine_installed(args.engine or study.sweep.engine or "inprocess")
        check_runs([s for s in owed if run_state(outs[id(study)] / s.name) != "finished"], outs[id(study)], export)
    if args.list:
        for line in budget_plan(studies, budget):
            say(line)
        return 0
    engines: dict[str, Engine] = {}
    terminal = sys.stdout.isatty()
    quiet = not os.environ.get("PFLOWER_VERBOSE")

    def echo(line: str) -> None:
        shown = for_terminal(line, terminal)
        if shown is not None and (not quiet or "[round " in line or "ERROR" in line):
            print("  " + shown, flush=True)

    digests: dict[str, str] = {}

    def run_one(study: StudyState, run: RunState) -> RunResult:
        out = outs[id(study)]
        if run.state != "missing" and set_aside(out / run.spec.name):
            say(f"budget: the finished run folder of {run.spec.name} ({run.state}) set aside under {out}/superseded")
        name = args.engine or study.sweep.engine or "inprocess"
        if name not in engines:
            engines[name] = make_engine(name, PROJECT, args.workers, export)
        if run_state(out / run.spec.name) != "finished":  # a run folder finished earlier: its own code is found
            digests[run.spec.name] = code_digest()
        result = execute(engines[name], PROJECT, run.spec, out, _gpu(), echo, args.timeout)
        if result.status == "finished":
            drop_resume_state(result.run_dir)
        say(f"budget: {run.spec.name} {result.status} in {result.seconds / 60:.1f} min {result.reason}".rstrip())
        return result

    def land(study: StudyState, run: RunState, result: RunResult) -> None:
        land_record(study, run, result.run_dir, args.commit, say, digests.get(run.spec.name), export)

    try:
        outcome = run_budgeted(studies, budget, run_one, land, say)
    finally:
        for engine in engines.values():
            engine.close()
    say(
        f"budget: {len(outcome.landed)} record(s) landed, {len(outcome.failed)} run(s) failed, "
        f"{len(outcome.not_fitted)} left for a later budget, {len(outcome.gpu)} needing a GPU"
    )
    return 1 if outcome.failed else 0


def _gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())
