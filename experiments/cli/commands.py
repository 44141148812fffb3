"""What each `pflower` subcommand does: one handler each, `args` in, exit status out (HANDLERS)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from common.hparams import ConfigError
from common.storage.run_folder import CONFIG_FILE, RunFolder
from experiments.run.launchers import make_engine
from experiments.run.presets import PRESETS, preset
from experiments.run.runs import (
    RunResult,
    RunSpec,
    app_commit,
    changed_settings,
    drop_resume_state,
    execute,
    parse_assignment,
    parse_seeds,
    plan,
    run_commits,
    run_state,
)

from .parser import PROJECT


def presets(args: argparse.Namespace) -> int:
    """List the presets and their settings."""
    for item in PRESETS.values():
        print(f"{item.name}: {item.help}")
        print(f"  clients = {item.clients}")
        for key, value in item.run_config.items():
            print(f"  {key} = {value!r}")
    return 0


def keys(args: argparse.Namespace) -> int:
    """List every run-config key as TOML (its default), with its meaning as a comment."""
    from common.config import key_infos
    from common.hparams import toml_value

    for key, info in sorted(key_infos().items()):
        print(f"{key} = {toml_value(info.default)}  # {info.hyper.help}")
    return 0


def stop_superlink(args: argparse.Namespace) -> int:
    """Stop the local SuperLink that `flwr run` of this environment started for this user."""
    from experiments.run.superlink import stop_flower_local_superlink

    print(stop_flower_local_superlink())
    return 0


def report(args: argparse.Namespace) -> int:
    """Markdown and figures across run folders."""
    from experiments.analysis.reports import write_report

    path = write_report(args.runs, args.out, args.baseline)
    _warn_without_figures()
    print(f"report: {path}")
    return 0


def export(args: argparse.Namespace) -> int:
    """Write the data export of a sweep's runs (one data set per export)."""
    from common.config import parse_run_config
    from common.data.federated import dataset_for
    from experiments.run.exports import rows_read, write_export
    from experiments.run.sweep import narrow, read_sweep

    sweep = read_sweep(args.file)
    specs = narrow(sweep, args.experiments, "--experiments").specs if args.experiments else sweep.specs
    configs = [parse_run_config(s.run_config) for s in specs]
    names = sorted({c.dataset for c in configs})
    if len(names) != 1:
        raise ConfigError(f"an export holds one data set; these runs read {', '.join(names)}: pick experiments")
    rows: set[int] = set()
    for spec, cfg in zip(specs, configs):
        rows |= rows_read(cfg.data, spec.clients)
    data = dataset_for((configs[0]).data)
    size = write_export(data, rows, args.out, webp=args.webp)
    print(f"export: {args.out} ({len(rows):,} of {len(data.y):,} samples of {data.name}, {size / 1e6:.1f} MB)")
    return 0


def privacy(args: argparse.Namespace) -> int:
    """The leakage audit (experiments/audit): table, scores and figure in --out."""
    import importlib.util

    from experiments.audit.run import Private, audit, check_uploads, write_audit

    if importlib.util.find_spec("torchmetrics") is None:
        raise ConfigError("pflower privacy scores images with torchmetrics: pip install -e '.[study]'")

    def numbers(text: str, what: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise ConfigError(f"--{what} {text!r}: comma-separated whole numbers") from None
        if not values or any(v < (0 if what == "seeds" else 1) for v in values):
            raise ConfigError(f"--{what} {text!r}: give at least one, each {'0' if what == 'seeds' else '1'} or more")
        return values

    uploads = [u.strip() for u in args.uploads.split(",") if u.strip()]
    check_uploads(uploads)
    methods = [m.strip() for m in args.attacks.split(",") if m.strip()]
    if not methods or any(m not in ("ig", "dlg") for m in methods):
        raise ConfigError(f"--attacks {args.attacks!r}: ig, dlg or both")
    if args.clients < 1 or args.steps < 1 or args.iterations < 1 or not args.lr > 0:
        raise ConfigError("--clients, --steps and --iterations must be 1 or more, --lr positive")
    batches, seeds = numbers(args.batch_sizes, "batch-sizes"), numbers(args.seeds, "seeds")
    if args.dp_noise_multiplier < 0 or not args.dp_clip_norm > 0:
        raise ConfigError("--dp-noise-multiplier must be 0 (no DP) or more, --dp-clip-norm positive")
    private = Private(args.dp_clip_norm, args.dp_noise_multiplier) if args.dp_noise_multiplier > 0 else None
    rows, shown, bounds = audit(
        args.dataset,
        args.data_dir,
        uploads,
        batches,
        methods,
        seeds,
        args.clients,
        args.steps,
        args.lr,
        args.iterations,
        lambda line: print(line, flush=True),
        private,
    )
    command = "pflower privacy " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("command", "out") and v != ""
    )
    path = write_audit(rows, shown, bounds, args.out, command)
    print(f"audit: {path}")
    return 0


def allow_takeover(args: argparse.Namespace) -> int:
    """Write the operator's consent to take-overs of partitions by one node (or, with --fresh-state, to its going on
    without the client state it last reported) into a run folder."""
    from server_app.takeover import CONSENT_FILE, FRESH_STATE_FILE, allow

    run_dir, partitions, node = args.run_dir, args.partitions, args.node
    if not RunFolder(run_dir).is_run():
        raise ConfigError(f"{run_dir} is not a run folder (no {CONFIG_FILE}): give the folder the server logged")
    if any(not 0 <= i < 2**64 for i in [*partitions, node]):
        raise ConfigError(f"partition and node ids are integers in [0, 2^64), got {partitions} and {node}")
    try:
        path = allow(run_dir, partitions, node, FRESH_STATE_FILE if args.fresh_state else CONSENT_FILE)
    except OSError as exc:
        raise ConfigError(f"cannot write the consent into {run_dir}: {exc}") from None
    listed = ", ".join(map(str, partitions))
    if args.fresh_state:
        print(f"allowed: node {node} to go on without its client state for partition(s) {listed} ({path}), once each")
    else:
        print(f"allowed: node {node} to take over partition(s) {listed} ({path}), once each")
    return 0


def results(args: argparse.Namespace) -> int:
    """The results documents of a sweep file's tables from its run records (and run folders without one); with
    --run its unfinished runs first; with --check where every study stands."""
    from experiments.run.sweep import document_sweep

    _check_workers(args)
    if args.check:
        from experiments.studies.check import check_studies

        return check_studies(args.file, lambda line: print(line, flush=True))
    if args.headline:
        from experiments.studies.headline import headline_studies, studies_of, write_headline

        def say(line: str) -> None:
            print(line, flush=True)

        path = write_headline(headline_studies(studies_of(args.file, say), say), args.out)
        print(f"results: {path} (the headline table)")
        return 0
    if len(args.file) != 1:
        raise ConfigError("pflower results takes one sweep file (several only with --check)")
    file = args.file[0]
    only = ",".join(args.only) if args.only else None
    sweep = document_sweep(file, only)  # a bad selection or a file without tables: refused before any run
    runs = Path(args.runs or Path("results") / sweep.name).expanduser().resolve()
    status = 0
    if args.run:
        status = _execute(args, sweep.specs, runs, args.engine or sweep.engine or "inprocess", True, False)
    from experiments.studies.documents import write_documents  # after the runs: their checks answer

    for path, done, total in write_documents(file, runs if runs.is_dir() else None, args.out, only, args.runs):
        print(f"results: {path} ({done} of {total} runs finished)")
    _warn_without_figures()
    return status


def run(args: argparse.Namespace) -> int:
    """One experiment (every seed) from a preset and overrides."""
    _check_workers(args)
    chosen = preset(args.preset)
    config = dict(parse_assignment(item) for item in args.set)
    config.update({k: v for k, v in (("algorithm", args.algorithm), ("dataset", args.dataset)) if v})
    name = args.name or "-".join(
        [
            config.get("algorithm", "fedavg"),
            config.get("dataset", chosen.run_config.get("dataset", "digits")),
            chosen.name,
        ]
    )
    if args.clients is not None and args.clients < 1:
        raise ConfigError("--clients must be at least 1")
    specs = plan(name, chosen, config, parse_seeds(args.seeds), args.clients)
    out = Path(args.out).expanduser().resolve() / name  # one folder per experiment: `pflower report` reads it whole
    return _execute(args, specs, out, args.engine or "inprocess", False, True)


def sweep(args: argparse.Namespace) -> int:
    """A TOML file of experiments (its unfinished runs), or with --list the state of each; with --budget the owed
    runs of one or more study files within the budget, each finished run's record written (and committed)."""
    from experiments.run.sweep import narrow, read_sweep, shard

    _check_workers(args)
    if args.budget:
        from experiments.cli.studies import budgeted_sweep

        return budgeted_sweep(args)
    if args.commit:
        raise ConfigError("--commit commits the records of a budgeted sweep: give --budget too")
    if len(args.file) != 1:
        raise ConfigError("several sweep files run as one budgeted sweep: give --budget (e.g. --budget 2h30m)")
    chosen = read_sweep(args.file[0])
    out = Path(args.out or Path("results") / chosen.name).expanduser().resolve()
    specs = narrow(chosen, ",".join(args.only)).specs if args.only else chosen.specs
    specs = shard(specs, args.shard) if args.shard else specs
    if args.list:
        for spec in specs:
            diff = changed_settings(spec, out / spec.name)
            changed = " (made with other settings: " + "; ".join(diff) + ")" if diff else ""
            print(f"{spec.name}: {run_state(out / spec.name)}{changed}")
        return 0
    return _execute(args, specs, out, args.engine or chosen.engine or "inprocess", True, args.keep_state)


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "presets": presets,
    "keys": keys,
    "stop-superlink": stop_superlink,
    "report": report,
    "export": export,
    "allow-takeover": allow_takeover,
    "privacy": privacy,
    "results": results,
    "run": run,
    "sweep": sweep,
}


def _warn_without_figures() -> None:
    """One line on stderr when the documents were written without their figures (no matplotlib)."""
    from experiments.analysis.figures import SKIPPED, figures_available

    if not figures_available():
        print(f"pflower: warning: {SKIPPED}", file=sys.stderr)


# ----- running specs ----------------------------------------------------------------------------------------------
def _check_workers(args: argparse.Namespace) -> None:
    if args.workers < 0:
        raise ConfigError("--workers must be 0 (one per core) or more")


def _app_dir(path: Path) -> Path:
    app = path.expanduser().resolve()
    text = (app / "pyproject.toml").read_text() if (app / "pyproject.toml").is_file() else ""
    if "[tool.flwr.app]" not in text:
        raise ConfigError(f"{app} is not a Flower app folder (no pyproject.toml with [tool.flwr.app]); pass --app")
    return app


def _shown(path: Path) -> str:
    """A path as the user can type it: relative to the working folder when below it."""
    try:
        return path.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def _gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _run_all(
    specs: list[RunSpec], out: Path, args: argparse.Namespace, engine_name: str, sweep: bool, keep_state: bool = True
) -> list[RunResult]:
    """Run the specs on the engine (a sweep: with progress and ETA; a simulation on one private SuperLink, stopped
    at the end); without keep_state a finished run's checkpoint and client state are deleted."""
    from experiments.run.output import for_terminal
    from experiments.run.sweep import run_sweep

    gpu = _gpu()
    out.mkdir(parents=True, exist_ok=True)
    quiet = sweep and not os.environ.get("PFLOWER_VERBOSE")
    terminal = sys.stdout.isatty()

    def echo(line: str) -> None:
        shown = for_terminal(line, terminal)
        if shown is not None and (not quiet or "[round " in line or "ERROR" in line):
            print(("  " if quiet else "") + shown, flush=True)

    engine = make_engine(
        engine_name, args.app, args.workers, args.data_export.expanduser().resolve() if args.data_export else None
    )
    try:

        def one(spec: RunSpec) -> RunResult:
            result = execute(engine, args.app, spec, out, gpu, echo, args.timeout)
            if not keep_state and result.status == "finished":
                drop_resume_state(result.run_dir)
            return result

        label = "sweep" if sweep else "run"
        print(f"{label}: engine {engine_name}", flush=True)
        return run_sweep(specs, out, one, lambda text: print(text, flush=True), label)
    finally:
        engine.close()


def other_code_runs(specs: list[RunSpec], out: Path, app: Path) -> int:
    """How many kept runs under `out` recorded a commit other than the app's now (runs with none are not counted)."""
    now = app_commit(app)
    return sum(1 for s in specs if (commits := run_commits(out / s.name)) and commits[-1] != now)


def _execute(
    args: argparse.Namespace, specs: list[RunSpec], out: Path, engine: str, sweep: bool, keep_state: bool
) -> int:
    """Run the specs into `out` on the engine, say how it went; the exit status (0: every run finished)."""
    from experiments.run.preflight import check_engine_installed, check_runs
    from experiments.run.sweep import check_kept_runs, summary_line

    check_engine_installed(engine)
    export = args.data_export.expanduser().resolve() if args.data_export and engine == "inprocess" else None
    # every run that will run: unfinished ones, and finished ones made with other settings (--replace remakes them)
    check_runs(
        [s for s in specs if run_state(out / s.name) != "finished" or changed_settings(s, out / s.name)], out, export
    )
    args.app = _app_dir(args.app) if engine == "simulation" else PROJECT
    source = "this command" if args.command == "run" else "the sweep file"
    check_kept_runs(specs, out, getattr(args, "replace", False), lambda line: print(line, flush=True), source)
    other = other_code_runs(specs, out, args.app)
    if other:
        print(
            f"note: {other} kept run(s) were made with other code than {args.app} now holds; `pflower results` "
            "lists the commits of every run"
        )
    results = _run_all(specs, out, args, engine, sweep, keep_state=keep_state)
    label = "sweep" if sweep else "run"
    line, ok = summary_line(results, len(specs), label)
    print(line)
    if ok and args.command != "results":
        print(f"next: pflower report {_shown(out)}")
    return 0 if ok else 1
