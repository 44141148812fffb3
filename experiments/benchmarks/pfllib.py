"""PFLlib side by side on identical clients (bench/pfllib_side_by_side.py): the clients of a sweep file's runs
exported in PFLlib's data format, PFLlib (TsingZ0/PFLlib, its own code, unchanged) run on them with the same model,
batch size, local epochs, learning rate and rounds, one record per run, and the table of both sides.

PFLlib is run as its README says (`python main.py ...` in its system/ folder, here with `-dev cpu`) through a small
launcher that only (1) replaces the seed its main.py fixes at 0 by the run's seed and (2) logs each client's test
result as PFLlib computes it, so that both sides report the same statistic: the mean over clients of each client's
test accuracy (PFLlib prints the sample-weighted one; the record keeps both).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from common.config import ConfigError, RunConfig, parse_run_config
from common.data.federated import client_data
from common.storage.run_folder import RoundRecord, evaluation, evaluation_means
from experiments.analysis.stats import fmt_ci, mean_ci
from experiments.benchmarks.pfllib_timing import (
    TIMES_FILE,
    alone_round_seconds,
    check_rounds,
    read_timings,
    run_times,
)
from experiments.run.cpu_share import ALONE_CORES, CpuMeter, CpuShare, busy_cores
from experiments.run.runs import RunSpec
from experiments.run.superlink import stop_process_tree
from experiments.run.sweep import read_sweep
from experiments.run.tether import tethered_popen
from experiments.studies.records import read_records, records_folder

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "bench" / "sweeps" / "pfllib_setting.toml"
DOCUMENT = REPO / "docs" / "pfllib_side_by_side.md"
DATASET_NAMES = {"fashion-mnist": "FashionMNIST", "cifar10": "Cifar10"}  # PFLlib picks its CNN's shape by name
SIDE = ("fedavg", "scaffold", "moon", "perfedavg", "pfedme", "fedrod", "fedbabu", "fedala", "fedcp", "gpfl", "feddbe")


def pfllib_arguments(cfg: RunConfig) -> list[str]:
    """PFLlib's main.py algorithm and hyperparameter flags for this project's run config (the same values; where
    the two name a step size differently, the mapping is said)."""

    def p(name: str) -> str:
        return str(getattr(cfg.params, name))

    flags: dict[str, Callable[[], list[str]]] = {
        "fedavg": lambda: ["-algo", "FedAvg"],
        "scaffold": lambda: ["-algo", "SCAFFOLD", "-slr", p("scaffold_server_lr")],
        "moon": lambda: ["-algo", "MOON", "-mu", p("moon_mu"), "-tau", p("moon_tau")],
        # PFLlib's Per-FedAvg: its -lr is the inner (alpha) step, -bt the outer (beta) one; here alpha is
        # perfedavg-alpha and beta the run's lr
        "perfedavg": lambda: ["-algo", "PerAvg", "-bt", str(cfg.training.lr)],
        "pfedme": lambda: [
            "-algo",
            "pFedMe",
            "-lam",
            p("pfedme_lambda"),
            "-K",
            p("pfedme_k"),
            "-lrp",
            p("pfedme_personal_lr"),
            "-bt",
            p("pfedme_beta"),
        ],
        "fedrod": lambda: ["-algo", "FedROD"],
        "fedbabu": lambda: ["-algo", "FedBABU", "-fte", p("fedbabu_finetune_epochs")],
        "fedala": lambda: [
            "-algo",
            "FedALA",
            "-et",
            p("fedala_eta"),
            "-s",
            p("fedala_rand_percent"),
            "-p",
            p("fedala_layer_idx"),
        ],
        "fedcp": lambda: ["-algo", "FedCP", "-lam", p("fedcp_lambda")],
        "gpfl": lambda: ["-algo", "GPFL", "-lam", p("gpfl_lambda"), "-mu", p("gpfl_mu")],
        "feddbe": lambda: ["-algo", "FedDBE", "-klw", p("feddbe_kappa"), "-mo", p("feddbe_momentum")],
    }
    if cfg.algorithm not in flags:
        raise ConfigError(f"no PFLlib counterpart is mapped for {cfg.algorithm}; mapped: {', '.join(flags)}")
    lr = p("perfedavg_alpha") if cfg.algorithm == "perfedavg" else str(cfg.training.lr)
    return [
        *flags[cfg.algorithm](),
        *("-lr", str(lr), "-lbs", str(cfg.training.batch_size), "-ls", str(cfg.local_epochs)),
        *("-gr", str(cfg.num_rounds), "-jr", str(cfg.fraction_train), "-eg", "1", "-dev", "cpu", "-m", "CNN"),
    ]


def dataset_name(cfg: RunConfig, seed: int) -> str:
    """The exported data set's folder name (PFLlib chooses its CNN's input size by a name it contains)."""
    if cfg.dataset not in DATASET_NAMES:
        raise ConfigError(f"PFLlib's 4-layer CNN is sized for {', '.join(DATASET_NAMES)}, not {cfg.dataset}")
    return f"{DATASET_NAMES[cfg.dataset]}-pflower-{cfg.data.split.partition}{cfg.data.split.dirichlet_alpha:g}-s{seed}"


def export_clients(cfg: RunConfig, clients: int, into: Path) -> Path:
    """Write every client's training and test data, exactly as this project's run reads them (normalized), in
    PFLlib's format: <into>/<name>/{train,test}/<client>.npz holding {'x': ..., 'y': ...}."""
    folder = into / dataset_name(cfg, cfg.seed)
    if (folder / "done").is_file():
        return folder
    for part in ("train", "test"):
        (folder / part).mkdir(parents=True, exist_ok=True)
    for pid in range(clients):
        data = client_data(cfg.data, pid, clients)
        for part, x, y in (("train", data.train_x, data.train_y), ("test", data.test_x, data.test_y)):
            arrays = {"x": x.numpy().astype(np.float32), "y": y.numpy().astype(np.int64)}
            with open(folder / part / f"{pid}.npz", "wb") as handle:
                np.savez(handle, data=np.array(arrays, dtype=object))  # the layout PFLlib's reader expects
    (folder / "done").write_text("")
    return folder


LAUNCHER = r"""
import importlib, inspect, json, pkgutil, random, runpy, sys
import numpy as np, torch
seed, events_path, deps, args = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
if deps:
    sys.path.append(deps)
_seed = torch.manual_seed
torch.manual_seed = lambda _ignored: _seed(seed)  # main.py fixes 0 at import: the run's seed instead
np.random.seed(seed)
random.seed(seed)
events = open(events_path, "a")
depth = [0]
def logged(method):
    def call(self, *a, **k):
        depth[0] += 1
        try:
            out = method(self, *a, **k)
        finally:
            depth[0] -= 1
        if depth[0] == 0 and isinstance(out, tuple) and len(out) >= 2:
            events.write(json.dumps({"id": int(self.id), "correct": float(out[0]), "num": int(out[1])}) + "\n")
            events.flush()
        return out
    return call
import flcore.clients
for info in pkgutil.iter_modules(flcore.clients.__path__):
    module = importlib.import_module("flcore.clients." + info.name)
    for _, cls in inspect.getmembers(module, inspect.isclass):
        for name in ("test_metrics", "test_metrics_personalized"):
            if name in cls.__dict__ and not getattr(cls.__dict__[name], "_logged", False):
                wrapped = logged(cls.__dict__[name])
                wrapped._logged = True
                setattr(cls, name, wrapped)
sys.argv = ["main.py", *args]
runpy.run_path("main.py", run_name="__main__")
"""

ROUND_TIME = re.compile(r"^-{25,}(?: time cost -+)?\s+([0-9.eE+-]+)\s*$")


@dataclass(frozen=True)
class PFLlibRun:
    """What one PFLlib run gave: per evaluation the mean over clients and the sample-weighted accuracy, and the
    seconds of each round as PFLlib timed it."""

    mean: list[float]
    weighted: list[float]
    seconds: list[float]


class PFLlibCrash(RuntimeError):
    """PFLlib itself raised an exception (a traceback and exit status 1): the same seed crashes the same way, so the
    run is recorded as crashed rather than tried again; `error` is the exception's last line."""

    def __init__(self, message: str, error: str) -> None:
        super().__init__(message)
        self.error = error


NOT_PFLLIBS = ("MemoryError", "KeyboardInterrupt", "SystemExit")  # the machine's or the operator's, not PFLlib's


def crash_error(returncode: int, stderr: str) -> str | None:
    """The exception line of a run that PFLlib's own code crashed (exit 1 after a traceback), or None (a timeout, a
    signal, a lack of memory: the machine's, worth another try)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    if returncode != 1 or "Traceback (most recent call last):" not in stderr or not lines:
        return None
    last = lines[-1].strip()
    name = last.split(":", 1)[0]
    if not re.fullmatch(r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*", name) or name.rsplit(".", 1)[-1] in NOT_PFLLIBS:
        return None
    return last


def read_events(path: Path, clients: int) -> tuple[list[float], list[float]]:
    """Each evaluation's mean over clients and sample-weighted accuracy, from the launcher's per-client lines (one
    evaluation = one result from each of the `clients`, in order; a trailing partial one is dropped)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    means, weighted = [], []
    for start in range(0, len(rows) - clients + 1, clients):
        chunk = rows[start : start + clients]
        accs = [r["correct"] / r["num"] for r in chunk if r["num"] > 0]
        means.append(float(np.mean(accs)) if accs else float("nan"))
        total = sum(r["num"] for r in chunk)
        weighted.append(sum(r["correct"] for r in chunk) / total if total else float("nan"))
    return means, weighted


def run_pfllib(
    pfllib: Path, cfg: RunConfig, clients: int, work: Path, python: str, deps: str, timeout: float, threads: int = 0
) -> PFLlibRun:
    """Run PFLlib's main.py on the exported clients of this run config in a private copy of its system/ folder."""
    system = work / "system"
    if not system.is_dir():
        shutil.copytree(pfllib / "system", system, ignore=shutil.ignore_patterns("__pycache__"))
    export_clients(cfg, clients, work / "dataset")
    events = work / f"events-{cfg.algorithm}-{cfg.seed}.jsonl"
    events.unlink(missing_ok=True)
    args = [*pfllib_arguments(cfg), "-data", dataset_name(cfg, cfg.seed), "-nc", str(clients)]
    args += ["-ncl", str(10)]
    command = [python, "-c", LAUNCHER, str(cfg.seed), str(events), deps, *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if threads > 0:  # else torch's own count, as PFLlib runs by default
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    # tethered: a harness killed by SIGKILL leaves no PFLlib run going on for half an hour
    process = tethered_popen(command, cwd=system, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:  # past the timeout (subprocess.TimeoutExpired), Ctrl+C, SIGTERM
        stop_process_tree(process, graceful=False)
        raise
    log = work / f"log-{cfg.algorithm}-{cfg.seed}.txt"
    log.write_text(stdout + "\n--- stderr ---\n" + stderr)
    if process.returncode != 0:
        tail = "\n".join((stdout + stderr).splitlines()[-15:])
        message = f"PFLlib exited with {process.returncode} (log: {log}):\n{tail}"
        if (error := crash_error(process.returncode, stderr)) is not None:
            raise PFLlibCrash(message, error)
        raise RuntimeError(message)
    seconds = [float(m.group(1)) for line in stdout.splitlines() if (m := ROUND_TIME.match(line.strip()))]
    mean, weighted = read_events(events, clients)
    return PFLlibRun(mean, weighted, seconds)


def pfllib_seconds(pfllib: Path, args: argparse.Namespace) -> Callable[[RunSpec, int, Path], list[float]]:
    """PFLlib's seconds of each round for a spec at `rounds` rounds (its round 0 evaluation included, as it times)."""

    def run(spec: RunSpec, rounds: int, work: Path) -> list[float]:
        cfg = parse_run_config({**spec.run_config, "num-rounds": rounds})
        return run_pfllib(pfllib, cfg, spec.clients, work, args.python, args.deps, args.timeout, args.threads).seconds

    return run


def pfllib_checkout(path: str) -> Path:
    """The --pfllib folder, resolved (ConfigError when it has no system/main.py)."""
    pfllib = Path(path).resolve()
    if not (pfllib / "system" / "main.py").is_file():
        raise ConfigError(f"--pfllib {pfllib}: not a PFLlib checkout (no system/main.py)")
    return pfllib


def pfllib_commit(pfllib: Path) -> str:
    """The PFLlib checkout's commit, or 'unknown' (not a git checkout of its own: a copy inside another repository
    must not be recorded under that repository's commit)."""
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=pfllib, capture_output=True, text=True)
        if not top.stdout.strip() or Path(top.stdout.strip()).resolve() != pfllib.resolve():
            return "unknown"
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=pfllib, capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def crash_record(spec: RunSpec, cfg: RunConfig, commit: str, error: str) -> dict[str, Any]:
    """The committed record of a PFLlib run its own code crashed: what ran and the exception, no accuracy (delete
    the file to try it again)."""
    return {**_identity(spec, cfg, commit), "crashed": error, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _identity(spec: RunSpec, cfg: RunConfig, commit: str) -> dict[str, Any]:
    return {
        "schema": 1,
        "name": spec.name,
        "experiment": spec.experiment,
        "seed": spec.seed,
        "algorithm": cfg.algorithm,
        "dataset": cfg.dataset,
        "clients": spec.clients,
        "rounds": cfg.num_rounds,
        "pfllib": {"commit": commit, "arguments": pfllib_arguments(cfg)},
    }


def record_of(spec: RunSpec, cfg: RunConfig, run: PFLlibRun, commit: str, wall: float) -> dict[str, Any]:
    """The committed record of one PFLlib run. PFLlib evaluates before each round's training: its evaluation k is
    the model after k rounds, the same as this project's round k."""
    return {
        **_identity(spec, cfg, commit),
        "mean_accuracy": run.mean,  # index k: after k rounds (k = 0: before any)
        "weighted_accuracy": run.weighted,
        "round_seconds": run.seconds,
        "wall_seconds": wall,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def pfllib_records_folder() -> Path:
    """Where the PFLlib side's records are committed, beside this project's records of the same study."""
    return records_folder(SWEEP, read_sweep(SWEEP).name).parent / "pfllib"


def side_specs(algorithms: Sequence[str], experiments: str | None, seeds: str | None = None) -> list[RunSpec]:
    """The study's runs of the side by side (its experiments named <data set>-<algorithm>), optionally narrowed to
    comma-separated experiment names and seeds."""
    wanted = set(experiments.split(",")) if experiments else None
    chosen = {int(s) for s in seeds.split(",")} if seeds else None
    specs = []
    for spec in read_sweep(SWEEP).specs:
        algorithm = spec.experiment.split("-", 1)[1]
        if algorithm not in algorithms or (wanted is not None and spec.experiment not in wanted):
            continue
        if chosen is None or spec.seed in chosen:
            specs.append(spec)
    return specs


def run_side(args: argparse.Namespace, commit_record: Callable[[Path, str], None] | None = None) -> tuple[int, int]:
    """PFLlib's runs of the side by side that have no record yet, until the budget ends; (finished, failed)."""
    pfllib = pfllib_checkout(args.pfllib)
    folder = pfllib_records_folder()
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget_hours * 3600
    finished = failed = 0
    with tempfile.TemporaryDirectory(prefix="pfllib-side-") as tmp:
        work = Path(tmp)
        for spec in side_specs(args.algorithms.split(","), args.experiments, args.seeds):
            target = folder / f"{spec.name}.json"
            if target.is_file():
                continue
            if time.monotonic() > deadline:
                print(f"budget spent; next: {spec.name}", flush=True)
                break
            cfg = parse_run_config({**spec.run_config, **({"num-rounds": args.rounds} if args.rounds else {})})
            print(f"PFLlib: {spec.name} ({cfg.num_rounds} rounds) ...", flush=True)
            start = time.monotonic()
            try:
                with CpuMeter() as meter:
                    run = run_pfllib(
                        pfllib, cfg, spec.clients, work, args.python, args.deps, args.timeout, args.threads
                    )
            except PFLlibCrash as exc:
                print(f"PFLlib: {spec.name} crashed in PFLlib's code: {exc}", flush=True)
                failed += 1
                if not args.rounds:  # recorded, so later runs of the harness do not try it again
                    target.write_text(json.dumps(crash_record(spec, cfg, pfllib_commit(pfllib), exc.error)) + "\n")
                    if commit_record is not None:
                        commit_record(target, f"PFLlib side by side: {spec.name} crashed in PFLlib ({exc.error})")
                continue
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"PFLlib: {spec.name} failed: {exc}", flush=True)
                failed += 1
                continue
            wall = time.monotonic() - start
            last = run.mean[-1] if run.mean else float("nan")
            seconds = float(np.median(run.seconds)) if run.seconds else float("nan")
            print(
                f"PFLlib: {spec.name}: mean over clients by round {[round(100 * a, 2) for a in run.mean]}, "
                f"last {100 * last:.2f}%, median {seconds:.1f} s a round, {wall:.0f} s in all",
                flush=True,
            )
            finished += 1
            if args.rounds:
                continue  # a trial at other rounds than the study's: no record
            record = {**record_of(spec, cfg, run, pfllib_commit(pfllib), wall), "threads": args.threads or "torch's"}
            if meter.share is not None:  # the export and PFLlib's process: what else used the machine meanwhile
                record["cpu"] = meter.share.to_dict()
            target.write_text(json.dumps(record, indent=1) + "\n")
            if commit_record is not None:
                commit_record(target, f"PFLlib side by side: record {spec.name}")
    return finished, failed


def _ours(record: dict[str, Any]) -> tuple[list[float], list[float]]:
    rounds = cast(list[RoundRecord], record["rounds"])
    accs = [float(evaluation_means(r)["acc-shift-0"]) for r in rounds if evaluation(r) is not None]
    return accs, [float(r["wall_s"]) for r in rounds]


def _stat(values: list[float], best: bool) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return (max(finite) if best else finite[-1]) if finite else float("nan")


def _timing(
    shares: list[CpuShare | None], seconds: list[list[float]], rounds: list[int], timed: list[float]
) -> tuple[str, str]:
    """Median seconds a round over the runs made alone and the rounds `timed` alone by `time` ('n/a' when none
    was), and the median CPU seconds a round (the whole run's CPU over its rounds) over the runs that measured it."""
    alone = [s for share, secs in zip(shares, seconds) if share is not None and share.alone for s in secs] + timed
    cpu = [share.run_cpu_s / n for share, n in zip(shares, rounds) if share is not None and n > 0]
    return (f"{np.median(alone):.1f}" if alone else "n/a", f"{np.median(cpu):.1f}" if cpu else "n/a")


def side_table(ours_folder: Path | None = None, pfllib_folder: Path | None = None) -> str:
    """Markdown: per data set and algorithm, both sides' last- and best-round mean accuracy over clients (mean +/-
    95% t-interval over seeds; PFLlib's evaluation before any training left out), the median seconds a round of the
    runs made alone and the CPU seconds a round, with the runs each side has; from the committed records (or those
    of the folders given)."""
    study = records_folder(SWEEP, read_sweep(SWEEP).name)
    ours = read_records(ours_folder or study)
    folder = pfllib_folder or study.parent / "pfllib"
    theirs = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json")) if p.name != TIMES_FILE}
    crashed = {name: r for name, r in theirs.items() if "crashed" in r}
    timings = read_timings(folder)
    lines = [
        "| data set | algorithm | ours, last | PFLlib, last | ours, best | PFLlib, best | s/round ours (alone) | "
        "s/round PFLlib (alone) | CPU-s/round ours | CPU-s/round PFLlib | seeds (ours, PFLlib) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for spec_name in dict.fromkeys(spec.experiment for spec in side_specs(SIDE, None)):
        dataset, algorithm = spec_name.split("-", 1)
        records = [r for r in ours.values() if r["experiment"] == spec_name]
        mine = [_ours(r) for r in records]
        peer = [r for r in theirs.values() if r["experiment"] == spec_name and "crashed" not in r]
        lost = sum(r["experiment"] == spec_name for r in crashed.values())
        cells = []
        for best in (False, True):
            cells.append(fmt_ci(*mean_ci([_stat(accs, best) for accs, _ in mine])[:2]))
            cells.append(fmt_ci(*mean_ci([_stat(r["mean_accuracy"][1:], best) for r in peer])[:2]))
        ours_alone, ours_cpu = _timing(
            [CpuShare.from_dict(r.get("machine", {}).get("cpu")) for r in records],
            [secs for _, secs in mine],
            [len(r["rounds"]) for r in records],
            alone_round_seconds(timings, spec_name, "ours"),
        )
        peer_alone, peer_cpu = _timing(
            [CpuShare.from_dict(r.get("cpu")) for r in peer],
            [[float(s) for s in r["round_seconds"]] for r in peer],
            [int(r["rounds"]) for r in peer],
            alone_round_seconds(timings, spec_name, "pfllib"),
        )
        lines.append(
            f"| {dataset} | {algorithm} | {' | '.join(cells)} | {ours_alone} | {peer_alone} | {ours_cpu} | "
            f"{peer_cpu} | {len(mine)}, {len(peer)}{f' (+{lost} crashed)' if lost else ''} |"
        )
    if crashed:
        lines += ["", "Runs PFLlib's own code crashed (a seed crashes the same way each time):", ""]
        lines += [f"- `{name}`: {r['crashed']} (PFLlib {r['pfllib']['commit']})" for name, r in crashed.items()]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None, commit_record: Callable[[Path, str], None] | None = None) -> None:
    """`run` PFLlib's side (records under docs/claims/<study>/pfllib/) or print and write the `table`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run PFLlib on the study's clients, one record per finished run")
    run.add_argument("--pfllib", required=True, help="a PFLlib checkout (its system/main.py is run)")
    run.add_argument("--algorithms", default=",".join(SIDE), help="comma-separated, of: " + ", ".join(SIDE))
    run.add_argument("--experiments", default=None, help="only these experiments (comma-separated names)")
    run.add_argument("--seeds", default=None, help="only these seeds (comma-separated)")
    run.add_argument("--rounds", type=int, default=0, help="override the study's rounds (a trial; not recorded)")
    run.add_argument("--budget-hours", type=float, default=2.0, help="start no run after this many hours")
    run.add_argument("--timeout", type=float, default=6 * 3600, help="seconds one PFLlib run may take")
    run.add_argument(
        "--threads",
        type=int,
        default=0,
        help="PFLlib's torch threads (0: torch's default; 1 whenever anything else runs beside it: two threads on "
        "two busy cores ran a training step 9x slower)",
    )
    run.add_argument("--python", default=sys.executable, help="the interpreter that runs PFLlib")
    run.add_argument("--deps", default="", help="a folder of PFLlib's extra packages (pip install --target)")
    run.add_argument("--commit", action="store_true", help="commit each record as it is written")
    timing = sub.add_parser("time", help="seconds a round of both sides, back to back (run it with nothing else)")
    timing.add_argument("--pfllib", required=True, help="a PFLlib checkout (its system/main.py is run)")
    timing.add_argument("--algorithms", default=",".join(SIDE), help="comma-separated, of: " + ", ".join(SIDE))
    timing.add_argument("--experiments", default=None, help="only these experiments (comma-separated names)")
    timing.add_argument("--seed", default="1", help="the seed whose clients are timed (PFLlib's SCAFFOLD crashes on 0)")
    timing.add_argument("--rounds", type=int, default=3, help="rounds a side (the first warms up and is left out)")
    timing.add_argument("--workers", type=int, default=0, help="this project's worker processes (0: one per core)")
    timing.add_argument("--threads", type=int, default=0, help="PFLlib's torch threads (0: torch's default)")
    timing.add_argument("--timeout", type=float, default=3600, help="seconds one PFLlib run may take")
    timing.add_argument("--python", default=sys.executable, help="the interpreter that runs PFLlib")
    timing.add_argument("--deps", default="", help="a folder of PFLlib's extra packages (pip install --target)")
    timing.add_argument("--commit", action="store_true", help="commit the record after each experiment")
    sub.add_parser("table", help=f"print the side by side and write {DOCUMENT.relative_to(REPO)}")
    args = parser.parse_args(argv)
    # a stop (SIGTERM) unwinds like ^C: the private work folder and its exported data are removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        if args.command == "run":
            if args.rounds and args.commit:
                raise ConfigError("--rounds makes a trial: its records are not the study's; drop --commit")
            finished, failed = run_side(args, commit_record if args.commit else None)
            print(f"PFLlib side: {finished} finished, {failed} failed", flush=True)
            sys.exit(1 if failed else 0)
        if args.command == "time":
            pfllib = pfllib_checkout(args.pfllib)
            check_rounds(args.rounds)
            specs = side_specs(args.algorithms.split(","), args.experiments, args.seed)
            if not specs:
                raise ConfigError("no experiment of the side by side matches --algorithms, --experiments and --seed")
            if (cores := busy_cores()) is not None and cores > ALONE_CORES:
                print(
                    f"time: WARNING: other work keeps {cores:.1f} cores busy now; timings made beside it are "
                    "recorded as not alone and left out of the table",
                    flush=True,
                )
            folder = pfllib_records_folder()
            folder.mkdir(parents=True, exist_ok=True)
            hook = commit_record if args.commit else None
            run_times(args, specs, pfllib_seconds(pfllib, args), folder, pfllib_commit(pfllib), hook)
            print(f"time: {len(specs)} experiment(s) timed; `table` shows those made alone", flush=True)
            return
        table = side_table()
        print(table)
        DOCUMENT.write_text(DOCUMENT.read_text().split("<!-- table -->")[0] + "<!-- table -->\n" + table)
    except ConfigError as exc:
        sys.exit(f"error: {exc}")
