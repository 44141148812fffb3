"""A federation with emulated aarch64 devices: SuperNodes inside the arm64 root of deploy/emulated-device.sh (qemu
user emulation) and native ones, against the TLS SuperLink with node authentication behind the shipped nginx proxy.

For each algorithm it starts the SuperLink (experiments/run/deployment.py), registers every node's key, starts
`--emulated` SuperNodes in the root (deploy/emulated-device.sh supernode, each with its long-lived ClientApp
`pflower-clientapp` when --clientapp warm, or Flower's one process per message when cold) and `--native` ones on
this machine, and runs `--rounds` rounds on the embedded digits with every client in every round. Printed per
algorithm and round: its wall time and the replies used; per node (emulated or native): the median training
message (wall and CPU, from the ClientApp profile, common/profiling.py) and the peak resident memory (VmHWM) of
the SuperNode and of its ClientApp. Under qemu-user the memory is the emulator's process (guest memory, the
emulator and its code cache) and the times are many times a native arm64 core's (13-25x this machine's here):
the native node's figures stand beside them.

    sudo python bench/emulated_federation.py [--root /var/lib/pflower-emulated/arm64] [--algorithms fedavg,dmpfl]
        [--emulated 2] [--native 1] [--rounds 3] [--clientapp warm|cold] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from device_budget import fmt, last_summary, make_certificates, median, message_rows, peaks, run_to_end

from common.algorithms import SPECS
from common.storage.run_folder import METRICS_FILE, evaluation_means
from experiments.run.deployment import CONNECTION, TLSSuperLink, nginx_binary
from experiments.run.superlink import free_port, stop_process_tree

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "deploy" / "emulated-device.sh"


def wait_online(link: TLSSuperLink, nodes: int, timeout: float) -> None:
    """Wait until `nodes` SuperNodes are online at the SuperLink (an emulated one takes a minute or more to start)."""
    deadline = time.monotonic() + timeout
    while True:
        done = link.flwr("supernode", "list", CONNECTION, "--format", "json")
        try:
            listed = json.loads(done.stdout).get("nodes", [])
        except ValueError:
            listed = []
        online = sum(1 for node in listed if str(node.get("status", "")).lower() == "online")
        if online >= nodes:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"{online} of {nodes} SuperNodes online after {timeout:.0f} s; see {link.home}")
        time.sleep(5)


def federate(args: argparse.Namespace, algorithm: str, work: Path) -> dict:
    """One run of `algorithm`: per round its time and replies, per node its message times and peak memory."""
    certs = work / "certs"
    link = TLSSuperLink(work / f"home-{algorithm}", certs)
    link.env = {**link.env, "OMP_NUM_THREADS": "1"}
    nodes = args.emulated + args.native
    launchers: list[tuple[str, subprocess.Popen, Path]] = []  # (kind, process, profile folder on this machine)
    warm = args.clientapp == "warm"
    result: dict = {"algorithm": algorithm, "nodes": []}
    started = time.monotonic()
    try:
        link.start()
        for i in range(nodes):
            done = link.register(certs / "nodes" / f"node-{i}.pub")
            if done.returncode != 0:
                raise SystemExit(f"flwr supernode register failed: {done.stderr[-300:]}")
        for i in range(nodes):
            port = free_port()
            if i < args.emulated:
                inside = f"/var/lib/pflower/profile-{algorithm}-{i}"
                profile = args.root / inside.lstrip("/")
                shutil.rmtree(profile, ignore_errors=True)
                profile.mkdir(parents=True)
                state = f"/var/lib/pflower/state-{algorithm}-{i}"
                shutil.rmtree(args.root / state.lstrip("/"), ignore_errors=True)
                log = open(link.home / f"emulated-{i}.log", "ab")
                command = [
                    "bash", str(SCRIPT), "supernode", "--root", str(args.root),
                    "--superlink", f"127.0.0.1:{link.proxy.port}", "--ca", str(link.ca),
                    "--key", str(certs / "nodes" / f"node-{i}"), "--partition", str(i), "--partitions", str(nodes),
                    "--state-dir", state, "--isolation", "process" if warm else "subprocess",
                    "--runtime-port", str(port), "--", "--max-retries", "5",
                ]  # fmt: skip
                env = {**os.environ, "PFLOWER_PROFILE": inside}
                process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
                launchers.append(("emulated aarch64", process, profile))
            else:
                profile = work / f"profile-{algorithm}-{i}"
                profile.mkdir()
                link.env["PFLOWER_PROFILE"] = str(profile)
                config = f"partition-id={i} num-partitions={nodes} state-dir='{work / f'state-{algorithm}-{i}'}'"
                process, _ = link.start_supernode(certs / "nodes" / f"node-{i}", config, runtime_port=port, warm=warm)
                del link.env["PFLOWER_PROFILE"]
                launchers.append(("native x86_64", process, profile))
        wait_online(link, nodes, args.connect_timeout)
        result["connected_s"] = time.monotonic() - started
        results = work / "results"
        run_config = (
            f"algorithm='{algorithm}' dataset='digits' num-rounds={args.rounds} fraction-train=1.0 "
            f"fraction-evaluate=1.0 min-train-clients={nodes} local-epochs=1 eval-every=1 client-threads=1 "
            f"allow-unprotected=true round-timeout={args.round_timeout} results-dir='{results}' run-name='{algorithm}'"
        )
        code = run_to_end(link, run_config, args.timeout)
        for (kind, process, profile), i in zip(launchers, range(nodes)):
            messages = message_rows(profile)
            train = [m for m in messages if m.get("kind") == "train"]
            found = peaks(process.pid)
            node = {"node": i, "kind": kind, "supernode_peak_mb": found["supernode_peak_mb"]}
            node["clientapp_peak_mb"] = found["warm_clientapp_peak_mb"]
            if not warm or node["clientapp_peak_mb"] is None:  # one-shot ClientApps: their own profile lines
                node["clientapp_peak_mb"] = max((m["peak_rss_mb"] or 0 for m in messages), default=None)
            node["messages"] = len(messages)
            node["train_wall_s"] = median([m["end"] - m["start"] for m in train])
            node["train_cpu_s"] = median([m["train_cpu"] for m in train])
            node["overhead_cpu_s"] = median([m["overhead_cpu"] for m in train])
            result["nodes"].append(node)
        summary, folder = last_summary(results, algorithm)
        result["ended"] = "finished" if code == 0 and summary else ("timed out" if code is None else f"exit {code}")
        if folder is not None:
            metrics = [json.loads(line) for line in (folder / METRICS_FILE).read_text().splitlines()]
            result["rounds"] = [
                {
                    "round": m["round"],
                    "seconds": m.get("wall_s"),
                    "train_used": m.get("train", {}).get("used"),
                    "accuracy": evaluation_means(m).get("acc-shift-0"),
                }
                for m in metrics
                if "round" in m
            ]
    finally:
        for _, process, _ in launchers:
            stop_process_tree(process)
        link.stop()
    result["seconds"] = time.monotonic() - started
    result["log"] = str(link.home)
    return result


def report(results: list[dict], args: argparse.Namespace) -> str:
    """The rounds and the nodes as markdown tables."""
    lines = [
        f"{args.emulated} emulated aarch64 + {args.native} native SuperNodes, clientapp={args.clientapp}, digits, "
        f"{args.rounds} rounds, 1 torch thread per ClientApp\n",
        "| algorithm | ended | round | round time (s) | training replies used | mean accuracy |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        for row in r.get("rounds", []):
            accuracy = row["accuracy"]
            lines.append(
                f"| {r['algorithm']} | {r['ended']} | {row['round']} | {fmt(row['seconds'], 1)} "
                f"| {row['train_used']} | {fmt(accuracy * 100 if accuracy is not None else None, 1)} |"
            )
    lines += [
        "",
        "| algorithm | node | kind | messages | training message (s) | its training CPU (s) | CPU beyond training (s) "
        "| SuperNode peak (MB) | ClientApp peak (MB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for n in r["nodes"]:
            lines.append(
                f"| {r['algorithm']} | {n['node']} | {n['kind']} | {n['messages']} | {fmt(n['train_wall_s'], 2)} "
                f"| {fmt(n['train_cpu_s'], 2)} | {fmt(n['overhead_cpu_s'], 2)} | {fmt(n['supernode_peak_mb'])} "
                f"| {fmt(n['clientapp_peak_mb'])} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("/var/lib/pflower-emulated/arm64"))
    parser.add_argument("--algorithms", default="fedavg,dmpfl", help="comma-separated")
    parser.add_argument("--emulated", type=int, default=2, help="SuperNodes in the arm64 root")
    parser.add_argument("--native", type=int, default=1, help="SuperNodes on this machine")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clientapp", choices=("warm", "cold"), default="warm")
    parser.add_argument("--round-timeout", type=float, default=1800.0)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one run may take")
    parser.add_argument("--connect-timeout", type=float, default=900.0, help="seconds to wait for every node")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, certificates, runs)")
    args = parser.parse_args(argv)
    unknown = [a for a in args.algorithms.split(",") if a not in SPECS]
    if unknown:
        parser.error(f"unknown algorithm(s): {', '.join(unknown)}")
    if args.emulated < 0 or args.native < 0 or args.emulated + args.native < 2 or args.rounds < 1:
        parser.error("needs at least two SuperNodes in all and one round")
    if os.geteuid() != 0:
        parser.error("needs root (the emulated root is entered with chroot)")
    if args.emulated and not (args.root / "opt/pflower/venv/bin/pflower-clientapp").exists():
        parser.error(f"no device install in {args.root}: run `sudo deploy/emulated-device.sh setup` first")
    if nginx_binary() is None:
        parser.error("needs nginx (Debian: apt-get install nginx)")
    work = Path(tempfile.mkdtemp(prefix="pflower-emulated-"))
    results = []
    try:
        make_certificates(work / "certs", [f"node-{i}" for i in range(args.emulated + args.native)])
        for algorithm in args.algorithms.split(","):
            result = federate(args, algorithm, work)
            results.append(result)
            print(f"{algorithm}: {result['ended']} in {result['seconds']:.0f} s", file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(report(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
