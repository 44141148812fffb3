"""Device budgets per algorithm: what one SuperNode and its ClientApp need, measured in a real loopback deployment.

For each algorithm and model it starts the TLS SuperLink with node authentication behind the shipped nginx proxy
(experiments/run/deployment.py), two SuperNodes with a partition each, and runs a few rounds. The measured SuperNode
runs inside a cgroup (v1: memory.limit_in_bytes, cpu.cfs_quota_us of one CPU; this script makes and removes
/sys/fs/cgroup/{memory,cpu}/pflower-budget-*, so it needs root) with its ClientApp: `warm` (the default) serves
its messages with the long-lived `pflower-clientapp` (client_app/warm.py, SuperNode isolation `process`), `cold`
with Flower's one process per message (isolation `subprocess`). The ClientApp runs with one torch thread
(client-threads=1) and writes its profile (common/profiling.py, PFLOWER_PROFILE): per message its wall and CPU
time, the training phase's, and its peak resident memory (VmHWM). Printed per setting: peak resident memory of the
SuperNode, of the ClientApp during its largest training and its largest evaluation message (the profile resets
the process's high-water mark at each message) and over its life, the cgroup's peak (page cache included), the
median training message (wall and training CPU), the median CPU a training message costs beyond training
(imports, FAB, app load, data, decode/encode, state; for `warm` also the polling since the previous message),
bytes up and down per client and round, the client state on disk, and how the run ended (an OOM kill is counted
from the cgroup's memory.oom_control).

    sudo python bench/device_budget.py --data-dir ../shared/data [--algorithms fedavg,dmpfl] \\
        [--models mlp,cnn-mnist,cnn-cifar,resnet10] [--memory 2G] [--clientapp warm|cold] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common.algorithms import SPECS
from common.profiling import peak_rss_mb
from common.storage.run_folder import SUMMARY_FILE
from experiments.run.deployment import TLSSuperLink, nginx_binary
from experiments.run.superlink import descendants, free_port, stop_process_tree

REPO = Path(__file__).resolve().parent.parent
CGROUP = Path("/sys/fs/cgroup")
# the data set each model is measured on (a device keeps its own partition of it); max-samples keeps rounds short
MODEL_DATA = {
    "mlp": "digits",
    "cnn-mnist": "mnist",
    "cnn-mnist-bn": "mnist",
    "cnn-cifar": "cifar10",
    "cnn-cifar-bn": "cifar10",
    "resnet10": "cifar10",
}


@dataclass
class Group:
    """A cgroup v1 pair (memory, cpu) the measured SuperNode and its ClientApp run in."""

    name: str
    memory_bytes: int
    cpus: float

    def paths(self) -> tuple[Path, Path]:
        return CGROUP / "memory" / self.name, CGROUP / "cpu" / self.name

    def create(self) -> None:
        memory, cpu = self.paths()
        for path in (memory, cpu):
            path.mkdir(exist_ok=True)
        (memory / "memory.limit_in_bytes").write_text(str(self.memory_bytes))
        (cpu / "cpu.cfs_period_us").write_text("100000")
        (cpu / "cpu.cfs_quota_us").write_text(str(int(100000 * self.cpus)))

    def launcher(self) -> list[str]:
        """A prefix that moves the command into this group before it starts (its children follow)."""
        memory, cpu = self.paths()
        script = f'echo $$ > {memory}/cgroup.procs && echo $$ > {cpu}/cgroup.procs && exec "$@"'
        return ["/bin/sh", "-c", script, "in-group"]

    def peak_mb(self) -> float:
        return int((self.paths()[0] / "memory.max_usage_in_bytes").read_text()) / 2**20

    def oom_kills(self) -> int:
        for line in (self.paths()[0] / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def remove(self) -> None:
        for path in self.paths():
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # processes still leaving
                    time.sleep(0.1)


def parse_size(text: str) -> int:
    """'2G', '512M' or bytes."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)


def message_rows(profile: Path) -> list[dict]:
    """The measured node's ClientApp profile lines, each with the CPU it cost beyond its training phase."""
    rows = []
    for path in sorted(profile.glob("client-*.jsonl")):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        previous_end = 0.0
        for line in lines:
            handler = line["cpu_end"] - line["cpu_start"]
            before = line["cpu_start"] - previous_end  # imports and load (first), polling and pulling (warm)
            train_cpu = line.get("cpu_phases", {}).get("train", 0.0)
            rows.append({**line, "overhead_cpu": before + handler - train_cpu, "train_cpu": train_cpu})
            previous_end = line["cpu_end"]
    return rows


def message_peak(messages: list[dict]) -> float | None:
    """The largest resident peak of these messages, each its own (the profile resets the process's mark per
    message; where it could not, the process's peak so far)."""
    peaks = [m.get("message_peak_rss_mb") or m["peak_rss_mb"] for m in messages]
    return max((p for p in peaks if p is not None), default=None)


def make_certificates(out: Path, nodes: list[str]) -> None:
    """The CA, the SuperLink's certificate and one key pair per node (deploy/generate_certs.py) in `out`."""
    script = REPO / "deploy" / "generate_certs.py"
    command = [sys.executable, str(script), "--out", str(out), "--nodes", ",".join(nodes)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"generate_certs.py failed: {done.stderr[-500:]}")


def run_to_end(link: TLSSuperLink, run_config: str, timeout: float) -> int | None:
    """`flwr run` this app with `run_config` and wait; its exit status, None when it ran past `timeout` (stopped)."""
    runner = link.start_run(REPO, run_config)
    try:
        return runner.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process_tree(runner)
        return None


def last_summary(results: Path, run_name: str) -> tuple[dict | None, Path | None]:
    """The summary of the last run folder named `run_name`* under `results`, and that folder (None, None: none)."""
    summaries = sorted(results.glob(f"{run_name}*/{SUMMARY_FILE}"))
    return (json.loads(summaries[-1].read_text()), summaries[-1].parent) if summaries else (None, None)


def peaks(pid: int) -> dict[str, float | None]:
    """Peak resident memory (MB) of the SuperNode below (or at) a launcher process, and of the long-lived ClientApp
    (None when there is none, or it is gone)."""
    found: dict[str, float | None] = {"supernode_peak_mb": None, "warm_clientapp_peak_mb": None}
    for process in [pid, *descendants(pid)]:
        try:
            line = Path(f"/proc/{process}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        key = "supernode_peak_mb" if "flower-supernode" in line else ""
        key = key or ("warm_clientapp_peak_mb" if "pflower-clientapp" in line else "")
        peak = peak_rss_mb(process) if key else None
        if key and peak is not None:
            found[key] = max(found[key] or 0.0, peak)
    return found


def failure(home: Path) -> str:
    """Why a run ended without a summary: the ServerApp's first error line (`flwr run` exits 0 either way); the
    log's last lines go to stderr, since the deployment's folder is removed."""
    for path in [*sorted(home.glob("run-*.log")), home / "superlink.log", *sorted(home.glob("supernode-*.log"))]:
        lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
        if any("ERROR" in line or "Traceback" in line for line in lines):
            print(f"{path.name}, its last lines:", *lines[-40:], sep="\n  ", file=sys.stderr, flush=True)
    for path in sorted(home.glob("run-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if "ERROR" in line:
                return "refused: " + line.split("ERROR", 1)[1].strip(" :\x1b[0m")[:120]
    return "ended without a summary"


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measure(args: argparse.Namespace, algorithm: str, model: str, memory: int, work: Path) -> dict:
    """One deployment of `algorithm` with `model`; the measured node's figures."""
    certs, profile = work / "certs", work / f"profile-{algorithm}-{model}"
    profile.mkdir(parents=True)
    group = Group(f"pflower-budget-{os.getpid()}", memory, 1.0)
    group.create()
    link = TLSSuperLink(work / f"home-{algorithm}-{model}", certs)
    link.env = {**link.env, "PFL_DATA_DIR": str(args.data_dir), "OMP_NUM_THREADS": "1"}
    row: dict = {"algorithm": algorithm, "model": model, "memory_limit_mb": memory / 2**20}
    started = time.monotonic()
    try:
        link.start()
        for node in ("node-0", "node-1"):
            link.register(certs / "nodes" / f"{node}.pub")
        states = [work / f"state-{algorithm}-{model}-{i}" for i in range(2)]
        measured = None
        for i in range(2):
            port = free_port()
            config = f"partition-id={i} num-partitions=2 state-dir='{states[i]}'"
            warm = args.clientapp == "warm"
            if i == 0:
                link.env["PFLOWER_PROFILE"] = str(profile)
                measured, measured_log = link.start_supernode(
                    certs / "nodes" / "node-0", config, runtime_port=port, warm=warm, launcher=group.launcher()
                )
                del link.env["PFLOWER_PROFILE"]
            else:
                link.start_supernode(certs / "nodes" / "node-1", config, runtime_port=port, warm=warm)
        results = work / "results"
        run_config = (
            f"algorithm='{algorithm}' dataset='{MODEL_DATA[model]}' model='{model}' max-samples={args.samples} "
            f"num-rounds={args.rounds} fraction-train=1.0 local-epochs=1 batch-size=32 eval-every=1 "
            f"client-threads=1 allow-unprotected=true round-timeout=600 results-dir='{results}' "
            f"run-name='{algorithm}-{model}'"
        )
        code = run_to_end(link, run_config, args.timeout)
        assert measured is not None
        row.update(peaks(measured.pid))
        row["oom_named"] = "lack of memory" in measured_log.read_text(errors="replace")
        row["cgroup_peak_mb"] = group.peak_mb()
        row["oom_kills"] = group.oom_kills()
        summary, _ = last_summary(results, f"{algorithm}-{model}")
        row["ended"] = "finished" if code == 0 and summary else ("timed out" if code is None else failure(link.home))
        if summary:
            clients, rounds = summary["num_clients"], max(summary["rounds_completed"], 1)
            row["up_kb_round"] = summary["bytes_total"]["train_up"] / clients / rounds / 1e3
            row["down_kb_round"] = summary["bytes_total"]["train_down"] / clients / rounds / 1e3
        row["state_kb"] = sum(p.stat().st_size for p in states[0].rglob("*") if p.is_file()) / 1e3
    finally:
        link.stop()
        group.remove()
    messages = message_rows(profile)
    train = [m for m in messages if m.get("kind") == "train"]
    evaluate = [m for m in messages if m.get("kind") == "evaluate"]
    row["clientapp_train_peak_mb"] = message_peak(train)
    row["clientapp_eval_peak_mb"] = message_peak(evaluate)
    row["clientapp_peak_mb"] = max((m["peak_rss_mb"] or 0 for m in messages), default=None)
    row["eval_messages"] = len(evaluate)
    row["train_messages"] = len(train)
    row["train_wall_s"] = median([m["end"] - m["start"] for m in train])
    row["train_cpu_s"] = median([m["train_cpu"] for m in train])
    # the first message of a process pays for its start; warm: only one process's first message
    row["overhead_cpu_s"] = median([m["overhead_cpu"] for m in train])
    row["first_overhead_cpu_s"] = max((m["overhead_cpu"] for m in messages if m.get("first")), default=None)
    row["seconds"] = time.monotonic() - started
    return row


def fmt(value: object, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    head = (
        "| algorithm | model | ended | SuperNode peak (MB) | ClientApp peak: training / evaluation message, "
        "process (MB) | cgroup peak (MB) "
        "| training message (s) | its training CPU (s) | CPU beyond training (s): median / first "
        "| up / down per round (kB) "
        "| state on disk (kB) |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['algorithm']} | {r['model']} | {r['ended']}{' (OOM kill)' if r.get('oom_kills') else ''} "
        f"| {fmt(r.get('supernode_peak_mb'))} | {fmt(r.get('clientapp_train_peak_mb'))} / "
        f"{fmt(r.get('clientapp_eval_peak_mb'))}, {fmt(r.get('clientapp_peak_mb'))} | {fmt(r.get('cgroup_peak_mb'))} "
        f"| {fmt(r.get('train_wall_s'), 2)} "
        f"| {fmt(r.get('train_cpu_s'), 2)} | {fmt(r.get('overhead_cpu_s'), 2)} / "
        f"{fmt(r.get('first_overhead_cpu_s'), 2)} "
        f"| {fmt(r.get('up_kb_round'), 1)} / {fmt(r.get('down_kb_round'), 1)} | {fmt(r.get('state_kb'), 1)} |"
        for r in rows
    ]
    return head + "\n".join(lines)


def interrupted(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C: the `finally` blocks stop the SuperLink and SuperNodes and remove the cgroups."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_data = Path(os.environ.get("PFL_DATA_DIR", REPO.parent / "shared" / "data"))
    parser.add_argument("--data-dir", type=Path, default=default_data)
    parser.add_argument("--algorithms", default="all", help="comma-separated, or all")
    parser.add_argument("--models", default="mlp", help="comma-separated of " + ", ".join(MODEL_DATA))
    parser.add_argument("--memory", default="2G", help="the measured SuperNode's cgroup memory limit")
    parser.add_argument("--clientapp", choices=("warm", "cold"), default="warm")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=2000, help="max-samples: the federation's data set size")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    algorithms = list(SPECS) if args.algorithms == "all" else args.algorithms.split(",")
    models = args.models.split(",")
    unknown = [a for a in algorithms if a not in SPECS] + [m for m in models if m not in MODEL_DATA]
    if unknown:
        parser.error(f"unknown: {', '.join(unknown)}")
    if os.geteuid() != 0 or not (CGROUP / "memory").is_dir():
        parser.error("needs root and cgroup v1's memory and cpu controllers under /sys/fs/cgroup")
    if nginx_binary() is None:
        parser.error("needs nginx (Debian: apt-get install nginx)")
    signal.signal(signal.SIGTERM, interrupted)  # a kill or a timeout stops the deployment and removes its cgroups
    work = Path(tempfile.mkdtemp(prefix="pflower-budget-"))
    rows = []
    try:
        make_certificates(work / "certs", ["node-0", "node-1"])
        for model in models:
            for algorithm in algorithms:
                row = measure(args, algorithm, model, parse_size(args.memory), work)
                rows.append(row)
                print(f"{algorithm} {model}: {row['ended']} in {row['seconds']:.0f} s", file=sys.stderr, flush=True)
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=1))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the run in progress is stopped (measure's finally); say what stands
        print(f"stopped: {len(rows)} setting(s) measured, the one in progress dropped", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"clientapp={args.clientapp}, memory limit {args.memory}, 1 CPU (cfs quota), {args.rounds} rounds, "
        f"max-samples={args.samples}, 2 SuperNodes"
    )
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
