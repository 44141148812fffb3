"""Soak and load of a real deployment on loopback: the TLS SuperLink with SuperNode authentication behind the shipped
nginx proxy (experiments/run/deployment.py), SuperNodes as separate processes, every process stopped at the end.

Soak (per algorithm): NODES SuperNodes, ROUNDS rounds on MNIST (Dir(0.3)); every KILL_EVERY rounds a random SuperNode
is killed with SIGKILL (its ClientApp too) and started again DOWN_ROUNDS rounds later, as systemd's Restart= would
(the SuperLink refuses its key until the killed one's heartbeats lapse); at a third of the rounds the ServerApp is
killed and the run resumed from its checkpoint; at two thirds the SuperLink itself is restarted (its --database
keeps the registered keys and node ids) and the run resumed. Reported: rounds completed, replies used and lost,
resumes, the final accuracy against the same run without faults (the in-process engine, which sends the same
messages), whether every restarted SuperNode went on from the state it had saved (none silently fresh), the resident
memory of the SuperLink and the ServerApp over the run (first against last quarter; a figure), and each fault's
recovery time. Load: the most SuperNodes one SuperLink serves here with the `mlp` model, seconds per round at each
count, stopping where memory runs short. Every SuperNode stays connected (polling and sending heartbeats through the
proxy) while a round trains and evaluates `--load-clients` of them, and the first handshake keeps as many queries
out at once (messages-in-flight): on one machine every ClientApp would otherwise be a process of ~0.5-0.8 GB at once,
and 100 of them exhaust the memory before the SuperLink is measured. Each SuperNode here is ~270 MB (its process and
its ClientApp executor) before any message.

    python bench/soak.py --data-dir ../shared/data [--nodes 20] [--rounds 100] [--algorithms dmpfl,fedamp]
    python bench/soak.py --data-dir ../shared/data --load 10,50,100,200
    python bench/soak.py --data-dir ../shared/data --nodes 4 --rounds 9 --kill-every 3 --algorithms dmpfl  # a try

Bounded: each run gives up after --budget-minutes. Writes its logs, figure and tables under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.algorithms import SPECS
from common.hparams import ConfigError
from common.storage.run_folder import RunFolder, final_means
from experiments.analysis.figures import pyplot
from experiments.engine.serve import available_cores, serve
from experiments.run.deployment import TLSSuperLink, nginx_binary
from experiments.run.presets import run_config_text
from experiments.run.runs import parse_assignment
from experiments.run.superlink import descendants, stop_process_tree

REPO = Path(__file__).resolve().parent.parent
ADMITTED = "SuperNode ID:"
RESTORED = re.compile(r"client state restored from \S+partition-(\d+) \(round (\d+)\)")
ANSWERED = re.compile(r"Receiving: (?:train|evaluate) message")
EXECUTOR_BACK = "the ServerApp executor runs again"  # server_app/executor_watch.py
RESTART_S = 15.0  # deploy/systemd/flower-supernode.service: Restart=always, RestartSec=15


def resident_mb(pid: int | None) -> float:
    """A process's resident memory (MB; 0 when it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (OSError, TypeError):
        return 0.0
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(match.group(1)) / 1024 if match else 0.0


def cpu_seconds(pid: int | None) -> float:
    """A process's CPU time so far, user and system (s; 0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, TypeError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def available_mb() -> float:
    """The machine's available memory (MB)."""
    match = re.search(r"MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text())
    return int(match.group(1)) / 1024 if match else float("inf")


def serverapp_pid(link: TLSSuperLink) -> int | None:
    """The ServerApp process the SuperLink started (isolation subprocess), if one runs."""
    if link.process is None:
        return None
    for pid in descendants(link.process.pid):
        try:
            if b"flwr-serverapp" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def make_certs(out: Path, count: int) -> Path:
    """deploy/generate_certs.py for node-0 .. node-(count-1) (kept when they exist)."""
    names = ",".join(f"node-{i}" for i in range(count))
    done = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "generate_certs.py"), "--out", str(out), "--nodes", names],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise SystemExit(f"generate_certs.py failed: {done.stderr[-500:]}")
    return out


@dataclass
class Node:
    """One SuperNode: its process and log, and what the soak did to it."""

    index: int
    process: subprocess.Popen | None = None
    log: Path | None = None
    down_since: float | None = None
    restart_at_round: int | None = None
    saved_round: int | None = None  # its newest state file when it was killed
    exited_at: float | None = None  # when its process was seen ended by itself (not restarted yet)
    restarts: int = 0  # restarts after it ended by itself
    events: list[dict[str, Any]] = field(default_factory=list)


class Deployment:
    """A TLS SuperLink, its proxy and `nodes` SuperNodes with partitions 0..nodes-1 and their own state dirs."""

    def __init__(self, home: Path, certs: Path, nodes: int) -> None:
        self.home = home
        self.certs = certs
        # Every SuperNode here reaches the proxy from 127.0.0.1: its per-address limits are scaled to their number.
        self.link = TLSSuperLink(home / "link", certs, database=home / "link" / "state.db", nodes_per_address=nodes)
        self.nodes = [Node(i) for i in range(nodes)]

    def start(self) -> None:
        """The SuperLink and proxy, every key registered, every SuperNode started."""
        self.start_link()
        for node in self.nodes:
            self.start_node(node)

    def start_link(self) -> None:
        """The SuperLink and proxy, with every node's key registered."""
        self.link.start()
        for node in self.nodes:
            done = self.link.register(self.certs / "nodes" / f"node-{node.index}.pub")
            if done.returncode != 0 and "already" not in (done.stdout + done.stderr):
                raise SystemExit(f"registering node-{node.index} failed: {done.stdout[-300:]}{done.stderr[-300:]}")

    def node_config(self, node: Node) -> str:
        """Partition, partition count and state dir of a SuperNode."""
        state = self.home / f"state-{node.index}"
        return f"partition-id={node.index} num-partitions={len(self.nodes)} state-dir='{state}'"

    def start_node(self, node: Node) -> None:
        """Start (again) a SuperNode that retries its connection forever (the SuperLink may restart)."""
        node.process, node.log = self.link.start_supernode(
            self.certs / "nodes" / f"node-{node.index}", self.node_config(node), max_retries=None
        )

    def keep_up(self, node: Node) -> bool:
        """Restart a SuperNode that ended by itself RESTART_S after it did, as the shipped systemd unit would
        (e.g. exit 305: its activation timed out under load, and the retry was refused while the first
        activation still counts as online); its process group (its ClientApp executor) is stopped first.
        Returns whether it was started again now (with a new log)."""
        if node.process is None or node.process.poll() is None:
            return False
        if node.exited_at is None:
            stop_process_tree(node.process, graceful=False)
            node.exited_at = time.monotonic()
            return False
        if time.monotonic() - node.exited_at < RESTART_S:
            return False
        node.exited_at = None
        node.restarts += 1
        self.start_node(node)
        return True

    def admitted(self, node: Node) -> bool:
        """Whether the node's current process got its SuperNode id (after a start or a restart)."""
        return node.log is not None and ADMITTED in node.log.read_text(errors="replace")

    def stop(self) -> None:
        """Every SuperNode, the proxy and the SuperLink."""
        for node in self.nodes:
            if node.process is not None:
                stop_process_tree(node.process)
        self.link.stop()


def newest_state_round(home: Path, index: int) -> int | None:
    """The newest round a SuperNode saved its client state for (None: none yet)."""
    rounds = [int(p.stem.split("-")[1]) for p in (home / f"state-{index}").glob("*/partition-*/round-*.npz")]
    return max(rounds) if rounds else None


def rounds_done(run_dir: Path) -> list[Any]:
    """The run's round records so far."""
    return RunFolder(run_dir).rounds() if run_dir.exists() else []


def soak_config(args: argparse.Namespace, algorithm: str) -> dict[str, Any]:
    """The soak's run config (results folder and run name left out)."""
    return {
        "algorithm": algorithm,
        "dataset": "mnist",
        "data-dir": str(Path(args.data_dir).resolve()),
        "partition": "dirichlet",
        "dirichlet-alpha": 0.3,
        "num-rounds": args.rounds,
        "fraction-train": args.fraction,
        "local-epochs": 1,
        "batch-size": 32,
        "lr": 0.05,
        "eval-every": args.eval_every,
        "round-timeout": 300,  # an evaluation round starts 20 ClientApps at once on 2 cores here
        "checkpoint-every": 1,
        "max-weight-ratio": 4,  # the deployment recipes' settings
        **({"max-update-ratio": 3} if SPECS[algorithm].bounds_updates else {}),
        "seed": args.seed,
        **dict(args.set),
    }


def run_config_pair(text: str) -> tuple[str, Any]:
    """A `--set KEY=VALUE` as `pflower run --set` reads it (int, float, true/false or a string)."""
    try:
        return parse_assignment(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def reference_accuracy(args: argparse.Namespace, algorithm: str) -> float | None:
    """The same run without faults, on the in-process engine (it sends the deployment's messages): final accuracy."""
    out = Path(args.out).resolve() / f"reference-{algorithm}"
    config = {**soak_config(args, algorithm), "results-dir": str(out), "run-name": "reference"}
    if not serve(config, args.nodes, workers=args.workers):
        return None
    return final_means(RunFolder(out / "reference").summary()).get("acc-shift-0")


def soak(args: argparse.Namespace, algorithm: str, certs: Path) -> dict[str, Any]:
    """One algorithm's soak (module docstring); its report."""
    home = Path(args.out).resolve() / f"soak-{algorithm}"
    results = home / "results"
    settings = soak_config(args, algorithm)
    config = run_config_text({**settings, "results-dir": str(results), "run-name": "soak"})
    run_dir = results / "soak"
    deployment = Deployment(home, certs, args.nodes)
    rng = random.Random(args.seed)
    memory: list[tuple[float, int, float, float]] = []  # (seconds, rounds, SuperLink MB, ServerApp MB)
    faults: list[dict[str, Any]] = []
    started = time.monotonic()
    server_fault_at = {max(1, args.rounds // 3): "serverapp", max(2, 2 * args.rounds // 3): "superlink"}
    pending_recovery: list[dict[str, Any]] = []
    try:
        deployment.start()
        runner = deployment.link.start_run(REPO, config)
        last_kill, unexpected = 0, 0
        while time.monotonic() - started < 60 * args.budget_minutes:
            records = rounds_done(run_dir)
            done = len(records)
            now = time.monotonic() - started
            memory.append(
                (
                    now,
                    done,
                    resident_mb(deployment.link.process.pid if deployment.link.process else None),
                    resident_mb(serverapp_pid(deployment.link)),
                )
            )
            for fault in [f for f in pending_recovery if done > f["round"]]:
                fault["recovered_s"] = now - fault["at_s"]  # the next round completed after it
                pending_recovery.remove(fault)
            if deployment.link.process is not None and deployment.link.process.poll() is not None:
                # pflower-superlink ended by itself (code 3: its ServerApp executor kept dying): restarted as
                # systemd's Restart=on-failure would, and the run resumed
                code = deployment.link.process.returncode
                fault = {"kind": f"superlink exited with {code}", "round": done, "at_s": now}
                faults.append(fault)
                pending_recovery.append(fault)
                deployment.link.start_link()
                stop_process_tree(runner, graceful=False)
                runner = deployment.link.start_run(REPO, f"{config} resume='{run_dir}'")
                continue
            # `flwr run --stream` can stop streaming while its ServerApp goes on (it did in a 414 s evaluation round):
            # the run has ended only when its ServerApp has; resuming a live run would start a second ServerApp on
            # the same run folder.
            if runner.poll() is not None and serverapp_pid(deployment.link) is None:
                if done >= args.rounds and RunFolder(run_dir).finished():
                    break
                unexpected += 1  # the run ended by itself before its last round: resumed, a few times at most
                if unexpected > 3:
                    break
                runner = deployment.link.start_run(REPO, f"{config} resume='{run_dir}'")
                continue
            for node in deployment.nodes:  # restarts due, and admissions of restarted nodes
                if node.restart_at_round is not None and done >= node.restart_at_round:
                    if "restarted_s" not in node.events[-1]:
                        deployment.start_node(node)
                        node.events[-1]["restarted_s"] = now
                        node.events[-1]["logs"] = [str(node.log)]
                    elif not deployment.admitted(node) and deployment.keep_up(node):
                        # it was refused while its killed session still counted as online
                        node.events[-1]["logs"].append(str(node.log))
                    if deployment.admitted(node):
                        node.events[-1]["admitted_s"] = now
                        node.restart_at_round = None
            due = [k for r, k in server_fault_at.items() if done >= r and not any(f["kind"] == k for f in faults)]
            if due and done < args.rounds:
                fault = {"kind": due[0], "round": done, "at_s": now}
                if due[0] == "serverapp":
                    pid = serverapp_pid(deployment.link)
                    if pid is None:
                        time.sleep(0.5)
                        continue
                    os.kill(pid, signal.SIGKILL)
                else:
                    assert deployment.link.process is not None
                    stop_process_tree(deployment.link.process, graceful=False)
                    deployment.link.start_link()
                stop_process_tree(runner, graceful=False)  # its stream ends with the run; the operator resumes
                runner = deployment.link.start_run(REPO, f"{config} resume='{run_dir}'")
                faults.append(fault)
                pending_recovery.append(fault)
            if done >= last_kill + args.kill_every and done < args.rounds - args.down_rounds:
                up = [n for n in deployment.nodes if n.restart_at_round is None and n.process is not None]
                if up:  # one not killed before when there is one: a restarted node first shows it rejoins
                    node = rng.choice([n for n in up if not n.events] or up)
                    node.saved_round = newest_state_round(home, node.index)
                    assert node.process is not None
                    stop_process_tree(node.process, graceful=False)
                    node.restart_at_round = done + args.down_rounds
                    node.events.append({"killed_round": done, "killed_s": now, "saved_round": node.saved_round})
                    fault = {"kind": f"supernode {node.index}", "round": done, "at_s": now}
                    faults.append(fault)
                    pending_recovery.append(fault)
                last_kill = done
            time.sleep(1.0)
    finally:
        deployment.stop()
    return report(args, algorithm, home, run_dir, deployment, memory, faults)


def report(
    args: argparse.Namespace,
    algorithm: str,
    home: Path,
    run_dir: Path,
    deployment: Deployment,
    memory: list[tuple[float, int, float, float]],
    faults: list[dict[str, Any]],
) -> dict[str, Any]:
    """The soak's figures: rounds, replies, resumes, accuracy, client state across restarts, memory, recovery."""
    records = rounds_done(run_dir)
    summary = RunFolder(run_dir).summary() if RunFolder(run_dir).finished() else None
    restarts = [(n.index, e) for n in deployment.nodes for e in n.events]
    answered, fresh = [], []
    for index, event in restarts:  # what each restarted SuperNode did: answered messages, from the state it saved?
        text = "".join(Path(log).read_text(errors="replace") for log in event.get("logs", []))
        handled = len(ANSWERED.findall(text))
        rounds = [int(r) for pid, r in RESTORED.findall(text) if int(pid) == index]
        event.update(messages=handled, restored_rounds=rounds)
        if handled:
            answered.append(index)
            if event["saved_round"] is not None and not any(r >= event["saved_round"] for r in rounds):
                fresh.append(index)
    link_log = home / "link" / "superlink.log"
    quarter = max(1, len(memory) // 4)
    link_mb = [m[2] for m in memory if m[2] > 0]
    server_mb = [m[3] for m in memory if m[3] > 0]
    return {
        "algorithm": algorithm,
        "rounds_completed": len(records),
        "replies_used": sum(r["train"].get("used", 0) for r in records),
        "replies_lost": sum(r["train"].get("sent", 0) - r["train"].get("used", 0) for r in records),
        "resumes": summary.get("resumed_after_rounds", []) if summary else [],
        "accuracy": final_means(summary).get("acc-shift-0") if summary else None,
        "supernode_restarts": len(restarts),
        "restarted_answered": answered,
        "restarted_fresh": fresh,
        "link_mb_first_last": (statistics.mean(link_mb[:quarter] or [0]), statistics.mean(link_mb[-quarter:] or [0])),
        "serverapp_mb_first_last": (
            statistics.mean(server_mb[:quarter] or [0]),
            statistics.mean(server_mb[-quarter:] or [0]),
        ),
        "executor_restarts": link_log.read_text(errors="replace").count(EXECUTOR_BACK) if link_log.exists() else 0,
        "faults": faults,
        "memory": memory,
        "node_events": {n.index: n.events for n in deployment.nodes if n.events},
    }


def load(args: argparse.Namespace, certs: Path, counts: list[int]) -> list[dict[str, Any]]:
    """Seconds per round with n SuperNodes connected (the `mlp` model, `--load-clients` of them trained and
    evaluated a round, 3 rounds) for each count, until the machine's memory runs short (fewer than --reserve-mb
    available, plus ~1 GB for each ClientApp a round starts) or SuperNodes stop being admitted."""
    rows: list[dict[str, Any]] = []
    reserve_mb = args.reserve_mb + 1000 * args.load_clients
    for count in counts:
        home = Path(args.out).resolve() / f"load-{count}"
        deployment = Deployment(home, certs, count)
        row: dict[str, Any] = {"nodes": count}
        try:
            deployment.start_link()
            for node in deployment.nodes:
                if available_mb() < reserve_mb:
                    row["stopped"] = f"memory: {available_mb():.0f} MB available after {node.index} SuperNodes"
                    break
                deployment.start_node(node)
            started = [n for n in deployment.nodes if n.log]
            began = time.monotonic()
            deadline = began + 600
            while time.monotonic() < deadline and not all(deployment.admitted(n) for n in started):
                for node in started:
                    deployment.keep_up(node)
                time.sleep(1.0)
            row["admitted"] = sum(deployment.admitted(n) for n in started)
            row["admit_s"] = time.monotonic() - began
            row["restarts_to_admit"] = sum(n.restarts for n in started)
            config = {
                **soak_config(args, "fedavg"),
                "model": "mlp",
                "num-rounds": 3,
                "fraction-train": min(1.0, args.load_clients / count),
                "fraction-evaluate": min(1.0, args.load_clients / count),
                "min-train-clients": min(count, args.load_clients),
                # the first handshake queries every node: one ClientApp (~0.5 GB) per message, on this one machine
                "messages-in-flight": args.load_clients,
                "eval-every": 3,
                "checkpoint-every": 0,
                "results-dir": str(home / "results"),
                "run-name": "load",
            }
            least, link_mb = available_mb(), 0.0
            link_pid = deployment.link.process.pid if deployment.link.process else None
            cpu_before, wall_before = cpu_seconds(link_pid), time.monotonic()
            runner = deployment.link.start_run(REPO, run_config_text(config))
            run_deadline = time.monotonic() + 900  # its own: the admission may have taken all of its 600 s
            while runner.poll() is None and time.monotonic() < run_deadline:
                least, link_mb = min(least, available_mb()), max(link_mb, resident_mb(link_pid))
                for node in started:
                    deployment.keep_up(node)
                time.sleep(1.0)
            row["link_cpu_pct"] = 100 * (cpu_seconds(link_pid) - cpu_before) / (time.monotonic() - wall_before)
            row["link_mb"] = link_mb
            records = rounds_done(home / "results" / "load")
            row["round_s"] = statistics.median(r["wall_s"] for r in records[1:2] or records) if records else None
            row["eval_round_s"] = records[-1]["wall_s"] if len(records) == 3 else None
            row["used"] = records[-1]["train"].get("used") if records else 0
            row["least_available_mb"] = least
            if row["admitted"] < len(started):
                row.setdefault("stopped", f"{row['admitted']} of {len(started)} admitted within 600 s")
            elif runner.poll() is None:
                row.setdefault("stopped", "the run did not end within 900 s")
        finally:
            deployment.stop()
        rows.append(row)
        print(json.dumps(row), flush=True)
        if "stopped" in row or row.get("admitted", 0) < count:
            break
    return rows


def figure(reports: list[dict[str, Any]], path: Path) -> None:
    """Resident memory of the SuperLink and the ServerApp over each soak's rounds."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(reports), figsize=(6 * len(reports), 3.5), squeeze=False)
    for ax, rep in zip(axes[0], reports):
        seconds = [m[0] / 60 for m in rep["memory"]]
        ax.plot(seconds, [m[2] for m in rep["memory"]], label="SuperLink")
        ax.plot(seconds, [m[3] for m in rep["memory"]], label="ServerApp")
        for fault in rep["faults"]:
            ax.axvline(fault["at_s"] / 60, color="grey", lw=0.5)
        ax.set(title=f"{rep['algorithm']}: resident memory", xlabel="minutes (grey: faults)", ylabel="MB")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def load_figure(rows: list[dict[str, Any]], path: Path) -> None:
    """Seconds per round and the SuperLink's resident memory against the SuperNodes connected."""
    plt = pyplot()
    measured = [r for r in rows if r.get("round_s") is not None]
    nodes = [r["nodes"] for r in measured]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    left.plot(nodes, [r["round_s"] for r in measured], marker="o", label="training round")
    left.plot(nodes, [r.get("eval_round_s") or float("nan") for r in measured], marker="s", label="evaluation round")
    left.set(xlabel="SuperNodes connected", ylabel="seconds", title="seconds per round")
    left.legend()
    right.plot(nodes, [r.get("link_mb", 0) for r in measured], marker="o")
    right.set(xlabel="SuperNodes connected", ylabel="MB", title="SuperLink resident memory")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def soak_table(reports: list[dict[str, Any]]) -> str:
    """Markdown: one row per algorithm."""
    lines = [
        "| algorithm | rounds | replies used / lost | resumes | accuracy (%) | without faults (%) | SuperNode restarts "
        "(answered again / of them fresh) | SuperLink MB (first / last quarter) | ServerApp MB (first / last "
        "quarter) | recovery (s, median / max) | executor restarts |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        recovery = [f["recovered_s"] for f in r["faults"] if "recovered_s" in f]
        acc = "-" if r["accuracy"] is None else f"{100 * r['accuracy']:.2f}"
        ref = "-" if r.get("reference") is None else f"{100 * r['reference']:.2f}"
        rec = f"{statistics.median(recovery):.0f} / {max(recovery):.0f}" if recovery else "-"
        lines.append(
            f"| {r['algorithm']} | {r['rounds_completed']} | {r['replies_used']} / {r['replies_lost']} | "
            f"{r['resumes']} | {acc} | {ref} | {r['supernode_restarts']} "
            f"({len(r['restarted_answered'])} / {len(r['restarted_fresh'])}) | "
            f"{r['link_mb_first_last'][0]:.0f} / {r['link_mb_first_last'][1]:.0f} | "
            f"{r['serverapp_mb_first_last'][0]:.0f} / {r['serverapp_mb_first_last'][1]:.0f} | {rec} | "
            f"{r.get('executor_restarts', 0)} |"
        )
    return "\n".join(lines)


def main() -> None:
    """Soak each algorithm (or ramp the load); print the tables, write the figure and the reports."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", default="results/soak")
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--fraction", type=float, default=0.25, help="fraction-train of the soak's runs")
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--algorithms", default="dmpfl,fedamp")
    parser.add_argument("--kill-every", type=int, default=7, help="rounds between two SuperNode kills")
    parser.add_argument("--down-rounds", type=int, default=3, help="rounds a killed SuperNode stays down")
    parser.add_argument("--budget-minutes", type=float, default=150, help="a soak run gives up after this long")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=available_cores(), help="the fault-free reference's workers")
    parser.add_argument("--load", default="", help="SuperNode counts to ramp through instead of the soak: 10,50")
    parser.add_argument("--reserve-mb", type=float, default=1500, help="the load ramp stops below this available")
    parser.add_argument(
        "--set",
        type=run_config_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another run-config key for every run, e.g. --set \"dmpfl-phase3='sampled'\" (repeatable)",
    )
    parser.add_argument("--load-clients", type=int, default=5, help="clients a load round trains and evaluates")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `kill` stops the deployment too (the finally blocks)
    if nginx_binary() is None:
        raise SystemExit("nginx is not installed (Debian: apt-get install nginx): the soak runs behind the proxy")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    counts = [int(c) for c in args.load.split(",") if c]
    certs = make_certs(out / "certs", max(counts + [args.nodes]))
    if counts:
        rows = load(args, certs, counts)
        print(
            f"\n{args.load_clients} clients trained and evaluated a round, every SuperNode connected\n\n"
            "| SuperNodes | admitted (s; restarts) | s / round | evaluation round (s) | replies used | "
            "SuperLink CPU (% of a core) | SuperLink MB | least available MB |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for row in rows:
            round_s = "-" if row.get("round_s") is None else f"{row['round_s']:.1f}"
            eval_s = "-" if row.get("eval_round_s") is None else f"{row['eval_round_s']:.1f}"
            print(
                f"| {row['nodes']} | {row.get('admitted', '-')} ({row.get('admit_s', 0):.0f} s; "
                f"{row.get('restarts_to_admit', 0)}) | {round_s} | {eval_s} | {row.get('used', '-')} | "
                f"{row.get('link_cpu_pct', 0):.0f} | {row.get('link_mb', 0):.0f} | "
                f"{row.get('least_available_mb', 0):.0f} |" + (f" {row['stopped']}" if "stopped" in row else "")
            )
        (out / "load.json").write_text(json.dumps(rows, indent=1))
        load_figure(rows, out / "load.png")
        print(f"\nfigure: {out / 'load.png'}")
        return
    for algorithm in args.algorithms.split(","):
        rep = soak(args, algorithm, certs)
        rep["reference"] = reference_accuracy(args, algorithm)
        (out / f"soak-{algorithm}.json").write_text(json.dumps(rep, indent=1, default=str))
        print(json.dumps({k: v for k, v in rep.items() if k != "memory"}, default=str), flush=True)
    # every soak written to this folder, earlier runs of other algorithms too: one table, one figure
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("soak-*.json"))]
    figure(reports, out / "soak-memory.png")
    print(
        f"\n{args.nodes} SuperNodes, {args.rounds} rounds, MNIST Dir(0.3), {100 * args.fraction:.0f}% a round; a "
        f"SuperNode killed every {args.kill_every} rounds and back {args.down_rounds} later, the ServerApp killed at "
        f"round {max(1, args.rounds // 3)}, the SuperLink restarted at {max(2, 2 * args.rounds // 3)}\n"
    )
    print(soak_table(reports))
    print(f"\nfigure: {out / 'soak-memory.png'}")


if __name__ == "__main__":
    main()
