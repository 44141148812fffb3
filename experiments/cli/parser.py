"""The `pflower` command line: one function per subcommand adds its arguments."""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments.run.presets import ENGINES, PRESETS

PROJECT = Path(__file__).resolve().parents[2]  # the Flower app: the folder holding pyproject.toml
DESCRIPTION = (
    "`pflower`: run an experiment by preset (`run`), a TOML sweep of them (`sweep`), a report across runs (`report`), "
    "the results document of a sweep (`results`), the leakage audit (`privacy`)."
)


def _run(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    run = sub.add_parser("run", help="run one experiment (every seed), on the in-process engine by default")
    run.add_argument("--preset", default="smoke", choices=sorted(PRESETS), help="base settings (default smoke)")
    run.add_argument("--algorithm", help="the algorithm (run-config `algorithm`)")
    run.add_argument("--dataset", help="the data set (run-config `dataset`)")
    run.add_argument("--seeds", default="0", help="comma-separated seeds, one run each (default 0)")
    run.add_argument("--clients", type=int, help="simulated clients (default: the preset's)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any run-config key")
    run.add_argument("--name", help="experiment name (default: algorithm-dataset-preset)")
    run.add_argument("--out", default="results", help="results folder; the runs go to OUT/<name>/ (default ./results)")
    _replace(run)
    return run


def _replace(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--replace",
        action="store_true",
        help="set aside (under OUT/superseded/) finished runs made with other settings than asked now, and make them "
        "again; an unfinished one is always set aside",
    )


def _sweep(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    sweep = sub.add_parser("sweep", help="run a TOML file of experiments; finished runs are kept and skipped")
    sweep.add_argument("file", type=Path, nargs="+", help="the sweep file (several: with --budget, in priority order)")
    sweep.add_argument(
        "--budget",
        help="a study's budgeted sweep, e.g. 2h30m: the owed runs (no run record, or a stale one) of the files in "
        "their order, seed by seed, never starting a run whose estimate does not fit in what is left; each finished "
        "run's record is written to docs/claims/<sweep name>/runs/ at once; a run estimated over 3 hours here is "
        "listed as needing a GPU",
    )
    sweep.add_argument(
        "--commit", action="store_true", help="with --budget: commit each record alone the moment it is written"
    )
    sweep.add_argument("--out", help="results folder (default results/<sweep name>)")
    sweep.add_argument(
        "--list",
        action="store_true",
        help="list the runs and their state, run nothing (with --budget: the owed runs in the order the budget "
        "takes them, and which would start if each took its estimate)",
    )
    _replace(sweep)
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
    return sweep


def _report(sub: argparse._SubParsersAction) -> None:
    report = sub.add_parser("report", help="markdown and figures across run folders (seeds pooled)")
    report.add_argument("runs", nargs="+", type=Path, help="run folders, or folders holding them (a sweep's)")
    report.add_argument("--out", type=Path, help="report folder (default: <first folder>/report)")
    report.add_argument("--baseline", help="experiment the others are compared with (default: a FedAvg one)")


def _results(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    results = sub.add_parser(
        "results",
        help="the results document of a sweep file's [[table]]s: ours beside the "
        "papers' numbers, order differences, notes, figures",
    )
    results.add_argument(
        "file",
        type=Path,
        nargs="*",
        help="the sweep file (its [[table]] entries); with --check any number (default: every bench/sweeps/*.toml)",
    )
    results.add_argument(
        "--check",
        action="store_true",
        help="list, for every study file, the runs whose record is missing or stale with the hours to make them, "
        "and exit 1 when a committed document differs from what its records generate",
    )
    results.add_argument(
        "--headline",
        action="store_true",
        help="write docs/results.md: every study file's claims with the verdicts of their current records",
    )
    results.add_argument(
        "--runs",
        type=Path,
        help="its results folder, for finished runs that have no record (default results/<sweep name>, if there)",
    )
    results.add_argument(
        "--out",
        type=Path,
        help="the markdown file; figures go to figures/ beside it (default: the sweep file's [[document]]s, else "
        "docs/results.md)",
    )
    results.add_argument(
        "--run",
        action="store_true",
        help="first run the sweep's runs that have not finished (as `pflower sweep` does), then write the document",
    )
    return results


def _export(sub: argparse._SubParsersAction) -> None:
    export = sub.add_parser(
        "export",
        help="write the samples a sweep's runs read to one file, for a machine without "
        "the data sets (then `pflower sweep FILE --data-export OUT` there)",
    )
    export.add_argument("file", type=Path, help="the sweep file")
    export.add_argument("--experiments", help="comma-separated experiment names (default: all)")
    export.add_argument("--out", type=Path, required=True, help="the export file (.npz)")
    export.add_argument("--webp", action="store_true", help="images as lossless WebP (about 0.6 of their size)")


def _privacy(sub: argparse._SubParsersAction) -> None:
    privacy = sub.add_parser(
        "privacy",
        help="the leakage audit: gradient inversion by an honest-but-curious server on one round's upload, per "
        "upload form, batch size and attack (docs/privacy.md)",
    )
    privacy.add_argument("--dataset", default="digits", help="digits (embedded), mnist, fashion-mnist or cifar10")
    privacy.add_argument("--data-dir", default="", help="the data sets' folder (default $PFL_DATA_DIR)")
    privacy.add_argument(
        "--uploads",
        default="dense,sparse:0.1,trained:dmpfl,trained:feddst,body,head",
        help="upload forms (comma-separated): dense, sparse:DENSITY (a masked view of a dense update), "
        "trained:dmpfl / trained:feddst (what a real client of the algorithm sends after its local training), body, "
        "head, pruned:RATIO (DapperFL)",
    )
    privacy.add_argument("--batch-sizes", default="1,8", help="comma-separated")
    privacy.add_argument("--attacks", default="ig,dlg", help="ig (Inverting Gradients), dlg (comma-separated)")
    privacy.add_argument("--seeds", default="0,1,2", help="comma-separated; each a fresh model and clients")
    privacy.add_argument("--clients", type=int, default=4, help="attacked clients per seed")
    privacy.add_argument("--steps", type=int, default=1, help="the clients' local SGD steps")
    privacy.add_argument("--lr", type=float, default=0.05, help="the clients' learning rate")
    privacy.add_argument("--iterations", type=int, default=300, help="the attack's iterations")
    privacy.add_argument(
        "--dp-noise-multiplier", type=float, default=0.0, help="> 0: the clients' uploads under local DP, this z"
    )
    privacy.add_argument("--dp-clip-norm", type=float, default=1.0, help="local DP's clip bound C (with the above)")
    privacy.add_argument("--out", type=Path, default=Path("results/privacy"), help="results folder")


def _listings(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("presets", help="list the presets")
    sub.add_parser("keys", help="list every run-config key as TOML: its default, and its meaning as a comment")
    sub.add_parser(
        "stop-superlink",
        help="stop the local SuperLink that `flwr run` started for this user's FLWR_HOME (and nothing else)",
    )


def _allow_takeover(sub: argparse._SubParsersAction) -> None:
    takeover = sub.add_parser(
        "allow-takeover",
        help="deployment (takeover = operator): let one node take over these partitions of a running or resumed "
        "run, once each (a replaced device)",
    )
    takeover.add_argument("run_dir", type=Path, help="the run's results folder (the server logs it at the start)")
    takeover.add_argument("partitions", type=int, nargs="+", help="partition ids")
    takeover.add_argument(
        "--node",
        type=int,
        required=True,
        help="the node id that may take them (the server's refusal line names it); a consent always names its node",
    )
    takeover.add_argument(
        "--fresh-state",
        action="store_true",
        help="instead: let the node that holds these partitions, whose client state is missing, start afresh (it "
        "sets aside what it holds and starts from none; the server's line naming the missing state gives the "
        "command), once each",
    )


def _only(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--only",
        action="append",
        metavar="EXPERIMENTS",
        help="only these experiments: comma-separated names or shell globs, e.g. 'fedampx-*,path-fliu'; may "
        "be given again to add more (results: the tables' rows and the claims of these experiments; with "
        "--run, only their runs)",
    )


def _engine_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="inprocess: the server in one process, the clients on worker processes, no Flower "
        "runtime in between (fastest, for studies); simulation: `flwr run` on a private "
        "SuperLink with Flower's Ray simulation (default: inprocess, or a sweep file's `engine`)",
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


def parser() -> argparse.ArgumentParser:
    """Every subcommand and its arguments."""
    top = argparse.ArgumentParser(prog="pflower", description=DESCRIPTION)
    sub = top.add_subparsers(dest="command", required=True)
    run, sweep = _run(sub), _sweep(sub)
    _report(sub)
    results = _results(sub)
    _export(sub)
    _privacy(sub)
    _listings(sub)
    _allow_takeover(sub)
    for command in (sweep, results):
        _only(command)
    for command in (run, sweep, results):
        _engine_options(command)
    return top
