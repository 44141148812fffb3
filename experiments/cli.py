"""`pflower`: run an experiment by preset (`run`), a TOML sweep of them (`sweep`), a report across runs (`report`)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from common.data.arrays import DataError
from common.hparams import ConfigError
from common.run_folder import CONFIG_FILE, RunFolder

from .engines import ENGINES, make_engine
from .presets import PRESETS, preset
from .runs import (
    RunResult,
    RunSpec,
    app_commit,
    drop_resume_state,
    execute,
    parse_assignment,
    parse_seeds,
    plan,
    run_commits,
)

PROJECT = Path(__file__).resolve().parents[1]  # the Flower app: the folder holding pyproject.toml


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pflower", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one experiment (every seed) on a private local simulation")
    run.add_argument("--preset", default="smoke", choices=sorted(PRESETS), help="base settings (default smoke)")
    run.add_argument("--algorithm", help="the algorithm (run-config `algorithm`)")
    run.add_argument("--dataset", help="the data set (run-config `dataset`)")
    run.add_argument("--seeds", default="0", help="comma-separated seeds, one run each (default 0)")
    run.add_argument("--clients", type=int, help="simulated clients (default: the preset's)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any run-config key")
    run.add_argument("--name", help="experiment name (default: algorithm-dataset-preset)")
    run.add_argument("--out", default="results", help="results folder (default ./results)")
    sweep = sub.add_parser("sweep", help="run a TOML file of experiments; finished runs are kept and skipped")
    sweep.add_argument("file", type=Path)
    sweep.add_argument("--out", help="results folder (default results/<sweep name>)")
    sweep.add_argument("--list", action="store_true", help="list the runs and their state, run nothing")
    sweep.add_argument(
        "--shard",
        help="K/N: run only every N-th run of the file, starting at the K-th (1-based), "
        "so that N sweeps on one results folder (side by side, or on machines sharing it) share "
        "the work",
    )
    sweep.add_argument(
        "--keep-state",
        action="store_true",
        help="keep each finished run's checkpoint and client state (by default they are deleted "
        "once the run has finished: only a run stopped midway reads them)",
    )
    report = sub.add_parser("report", help="markdown and figures across run folders (seeds pooled)")
    report.add_argument("runs", nargs="+", type=Path, help="run folders, or folders holding them (a sweep's)")
    report.add_argument("--out", type=Path, help="report folder (default: <first folder>/report)")
    report.add_argument("--baseline", help="experiment the others are compared with (default: a FedAvg one)")
    results = sub.add_parser(
        "results",
        help="the results document of a sweep file's [[table]]s: ours beside the "
        "papers' numbers, order differences, notes, figures",
    )
    results.add_argument("file", type=Path, help="the sweep file (its [[table]] entries)")
    results.add_argument("--runs", type=Path, help="its results folder (default results/<sweep name>)")
    results.add_argument(
        "--out",
        type=Path,
        default=Path("docs/results.md"),
        help="the markdown file; figures go to figures/ beside it (default docs/results.md)",
    )
    results.add_argument(
        "--run",
        action="store_true",
        help="first run the sweep's runs that have not finished (as `pflower sweep` does), then write the document",
    )
    export = sub.add_parser(
        "export",
        help="write the samples a sweep's runs read to one file, for a machine without "
        "the data sets (then `pflower sweep FILE --data-export OUT` there)",
    )
    export.add_argument("file", type=Path, help="the sweep file")
    export.add_argument("--experiments", help="comma-separated experiment names (default: all)")
    export.add_argument("--out", type=Path, required=True, help="the export file (.npz)")
    export.add_argument("--webp", action="store_true", help="images as lossless WebP (about 0.6 of their size)")
    sub.add_parser("presets", help="list the presets")
    sub.add_parser("keys", help="list every run-config key with its default (docs/configuration.md explains them)")
    sub.add_parser(
        "stop-superlink",
        help="stop the local SuperLink that `flwr run` started for this user's FLWR_HOME (and nothing else)",
    )
    takeover = sub.add_parser(
        "allow-takeover",
        help="deployment (takeover = operator): let another node take over these partitions of a running run, "
        "once each (a replaced device)",
    )
    takeover.add_argument("run_dir", type=Path, help="the run's results folder (the server logs it at the start)")
    takeover.add_argument("partitions", type=int, nargs="+", help="partition ids")
    takeover.add_argument(
        "--node", type=int, help="the node id that may take them (the server's refusal line names it; default: any)"
    )
    for command in (sweep, results):
        command.add_argument(
            "--only",
            action="append",
            metavar="EXPERIMENTS",
            help="only these experiments: comma-separated names or shell globs, e.g. 'fedampx-*,path-fliu'; may "
            "be given again to add more (results: the tables' rows and the claims of these experiments; with "
            "--run, only their runs)",
        )
    for command, default in ((run, "simulation"), (sweep, "inprocess"), (results, "inprocess")):
        command.add_argument(
            "--engine",
            choices=ENGINES,
            default=None,
            help=f"inprocess: the server in one process, the clients on worker processes, no Flower "
            f"runtime in between (fastest, for studies); simulation: `flwr run` on a private "
            f"SuperLink with Flower's Ray simulation (default: the sweep file's `engine`, "
            f"else {default})",
        )
        command.add_argument(
            "--workers", type=int, default=0, help="inprocess: client worker processes (default: one per core)"
        )
        command.add_argument(
            "--data-export",
            type=Path,
            help="inprocess: read the data from this file (`pflower export`) instead of the data sets",
        )
        command.add_argument(
            "--app", type=Path, default=PROJECT, help="simulation: the Flower app folder (default: this project)"
        )
        command.add_argument("--timeout", type=float, default=86_400.0, help="seconds a run may take")
    return parser


def _app_dir(path: Path) -> Path:
    app = path.expanduser().resolve()
    text = (app / "pyproject.toml").read_text() if (app / "pyproject.toml").is_file() else ""
    if "[tool.flwr.app]" not in text:
        raise ConfigError(f"{app} is not a Flower app folder (no pyproject.toml with [tool.flwr.app]); pass --app")
    return app


def _gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _run_all(
    specs: list[RunSpec], out: Path, args: argparse.Namespace, engine_name: str, sweep: bool, keep_state: bool = True
) -> list[RunResult]:
    """Run the specs on the engine (a sweep: with progress and ETA; a simulation on one private SuperLink, stopped
    at the end); without keep_state a finished run's checkpoint and client state are deleted."""
    from .sweep import run_sweep

    gpu = _gpu()
    out.mkdir(parents=True, exist_ok=True)
    quiet = sweep and not os.environ.get("PFLOWER_VERBOSE")

    def echo(line: str) -> None:
        if not quiet or "[round " in line or "ERROR" in line:
            print(("  " if quiet else "") + line, flush=True)

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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `pflower` console script; returns the exit code (0: everything finished)."""
    args = _parser().parse_args(argv)
    # a SIGTERM (`kill`, `timeout`) unwinds as Ctrl+C does, so the run in progress is stopped, not orphaned
    signal.signal(signal.SIGTERM, _terminated)
    try:
        return _dispatch(args)
    except (ConfigError, DataError) as exc:
        print(f"pflower: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as exc:
        if isinstance(exc, Terminated):
            print("pflower: terminated; finished runs are kept, `pflower sweep` resumes the rest", file=sys.stderr)
            return 143
        print("pflower: interrupted; finished runs are kept, `pflower sweep` resumes the rest", file=sys.stderr)
        return 130


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so that everything it started is stopped on the way out."""


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM handler: unwind."""
    raise Terminated()


def _dispatch(args: argparse.Namespace) -> int:
    from .sweep import document_sweep, narrow, read_sweep, shard

    if args.command == "presets":
        for item in PRESETS.values():
            print(f"{item.name}: {item.help}")
            print(f"  clients = {item.clients}")
            for key, value in item.run_config.items():
                print(f"  {key} = {value!r}")
        return 0
    if args.command == "keys":
        from common.config import known_keys

        for key, default in sorted(known_keys().items()):
            print(f"{key} = {default!r}")
        return 0
    if args.command == "stop-superlink":
        from .superlink import stop_flower_local_superlink

        print(stop_flower_local_superlink())
        return 0
    if args.command == "report":
        from .report import write_report

        path = write_report(args.runs, args.out, args.baseline)
        print(f"report: {path}")
        return 0
    if args.command == "export":
        return _export(args)
    if args.command == "allow-takeover":
        return _allow_takeover(args.run_dir, args.partitions, args.node)
    if getattr(args, "workers", 0) < 0:
        raise ConfigError("--workers must be 0 (one per core) or more")
    if args.command == "results":
        only = ",".join(args.only) if args.only else None
        sweep = document_sweep(args.file, only)  # a bad selection or a file without tables: refused before any run
        runs = Path(args.runs or Path("results") / sweep.name).expanduser().resolve()
        status = 0
        if args.run:
            status = _execute(args, sweep.specs, runs, args.engine or sweep.engine or "inprocess", True, False)
        from .results import shown_path, write_results  # after the runs: their checks answer at once

        command = (
            f"pflower results {shown_path(args.file)}"
            + (f" --runs {shown_path(args.runs)}" if args.runs else "")
            + (f" --out {shown_path(args.out)}" if args.out != Path("docs/results.md") else "")
            + (f" --only '{only}'" if only else "")
        )
        path, done, total = write_results(args.file, runs, args.out, command, only)
        print(f"results: {path} ({done} of {total} runs finished)")
        return status
    if args.command == "run":
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
        return _execute(args, specs, Path(args.out).expanduser().resolve(), args.engine or "simulation", False, True)
    sweep = read_sweep(args.file)
    out = Path(args.out or Path("results") / sweep.name).expanduser().resolve()
    specs = narrow(sweep, ",".join(args.only)).specs if args.only else sweep.specs
    specs = shard(specs, args.shard) if args.shard else specs
    if args.list:
        from .runs import changed_settings, run_state

        for spec in specs:
            changed = (
                " (made with other settings: " + "; ".join(diff) + ")"
                if (diff := changed_settings(spec, out / spec.name))
                else ""
            )
            print(f"{spec.name}: {run_state(out / spec.name)}{changed}")
        return 0
    return _execute(args, specs, out, args.engine or sweep.engine or "inprocess", True, args.keep_state)


def _allow_takeover(run_dir: Path, partitions: list[int], node: int | None) -> int:
    """Write the operator's consent to take-overs of `partitions` (by `node`, or any) into a run folder."""
    from server_app.takeover import allow

    if not RunFolder(run_dir).is_run():
        raise ConfigError(f"{run_dir} is not a run folder (no {CONFIG_FILE}): give the folder the server logged")
    if any(pid < 0 for pid in partitions) or (node is not None and node < 0):
        raise ConfigError(f"partition and node ids are non-negative, got {partitions} and {node}")
    try:
        path = allow(run_dir, partitions, node)
    except OSError as exc:
        raise ConfigError(f"cannot write the consent into {run_dir}: {exc}") from None
    who = f"node {node}" if node is not None else "any node"
    print(f"allowed: {who} to take over partition(s) {', '.join(map(str, partitions))} ({path}), once each")
    return 0


def _export(args: argparse.Namespace) -> int:
    """Write the data export of a sweep's runs (one data set per export)."""
    from common.config import parse_run_config
    from common.data.federated import dataset_for

    from .exports import rows_read, write_export
    from .sweep import narrow, read_sweep

    sweep = read_sweep(args.file)
    specs = narrow(sweep, args.experiments, "--experiments").specs if args.experiments else sweep.specs
    configs = [parse_run_config(s.run_config) for s in specs]
    names = sorted({c.dataset for c in configs})
    if len(names) != 1:
        raise ConfigError(f"an export holds one data set; these runs read {', '.join(names)}: pick experiments")
    rows: set[int] = set()
    for spec, cfg in zip(specs, configs):
        rows |= rows_read(cfg, spec.clients)
    data = dataset_for((configs[0]).data)
    size = write_export(data, rows, args.out, webp=args.webp)
    print(f"export: {args.out} ({len(rows):,} of {len(data.y):,} samples of {data.name}, {size / 1e6:.1f} MB)")
    return 0


def _execute(
    args: argparse.Namespace, specs: list[RunSpec], out: Path, engine: str, sweep: bool, keep_state: bool
) -> int:
    """Run the specs into `out` on the engine, say how it went; the exit status (0: every run finished)."""
    from .preflight import check_runs
    from .runs import run_state
    from .sweep import check_kept_runs, summary_line

    export = args.data_export.expanduser().resolve() if args.data_export and engine == "inprocess" else None
    check_runs([s for s in specs if run_state(out / s.name) != "finished"], out, export)
    args.app = _app_dir(args.app) if engine == "simulation" else PROJECT
    check_kept_runs(specs, out)
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
    if ok and len(specs) > 1 and args.command != "results":
        print(f"next: pflower report {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
