"""Secure aggregation's costs: bytes per client per round and seconds per round with and without run-config
`secagg` = secaggplus, on the in-process engine, for 10, 100 and 1,000 clients.

Setting: FedAvg, MNIST, `mlp` (the smallest model: the bytes that SecAgg+ adds are keys and shares, whose size does
not depend on the model, plus the masked vector, 4 or 8 bytes a value), every client trains every round
(fraction-train 1, max-samples 60 a client), 3 rounds, no evaluation; the figures are round 2's and 3's median (the
first round also starts the workers' ClientApps). Each client holds shares for `--shares` neighbours (itself
included, all of them when the cohort is smaller) and the threshold is the run's default (2/3 of the shares); the
modulus is 2**32 where it holds the cohort's sum, else the next power of two that does (8 bytes a value).
`secure s` is the server's wall time of the four exchanges and the unmasking (the round record's `secagg.seconds`),
which includes the clients' work (keys, Shamir shares, encryption, masks) as the workers serve it. The CPU columns
are the whole run's (3 rounds and the handshake), from the engine's closing line: the server process's, and the
ClientApps' per client per round.

`--deployment N` measures the same on a loopback deployment instead: a TLS SuperLink with node authentication
behind the shipped nginx proxy (experiments/run/deployment.py) and N SuperNodes, each a warm pair with its own
ClientApp process, with and without SecAgg+ (no CPU columns: the processes are Flower's).

    python bench/secagg_costs.py --data-dir ../shared/data [--clients 10,100,1000] [--shares 21]
    python bench/secagg_costs.py --data-dir ../shared/data --deployment 10
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common.storage.run_folder import RunFolder
from experiments.engine.serve import available_cores


def modulus_for(clients: int, quantization: int = 4194304) -> int:
    """2**32 where it holds the cohort's sum, else the next power of two that does."""
    return max(2**32, 1 << (clients * quantization).bit_length())


CPU_LINE = re.compile(r"CPU: server ([\d.]+) s, \d+ workers [\d.]+ s \(their ClientApps ran ([\d.]+) s\)")


def run_config(clients: int, secure: bool, shares: int, data_dir: str, home: Path, name: str) -> dict:
    """The measured run's config (FedAvg, MNIST, mlp, every client training, 3 rounds, no evaluation)."""
    config = {
        "algorithm": "fedavg",
        "dataset": "mnist",
        "model": "mlp",
        "num-rounds": 3,
        "fraction-train": 1.0,
        "min-train-clients": 3,
        "max-samples": 60 * clients,
        "eval-every": 0,
        "data-dir": data_dir,
        "results-dir": str(home),
        "run-name": name,
        "seed": 0,
        "round-timeout": 3600,
    }
    if secure:
        config.update(
            {
                "secagg": "secaggplus",
                "secagg-num-shares": float(min(shares, clients) if shares < clients else 1.0),
                "secagg-modulus-range": modulus_for(clients),
            }
        )
    return config


def run_one(clients: int, secure: bool, shares: int, data_dir: str, workers: int, home: Path) -> dict:
    """One run; the median of rounds 2-3: bytes per client, round seconds, the secure stages' seconds."""
    name = f"{'secagg' if secure else 'plain'}-{clients}"
    config = run_config(clients, secure, shares, data_dir, home, name)
    command = [sys.executable, "-m", "experiments.engine", "--run-config", json.dumps(config)]
    command += ["--clients", str(clients), "--workers", str(workers)]
    log = home / f"{name}.log"
    with log.open("w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, timeout=7200).returncode
    if code != 0:
        return {"failed": (log.read_text().strip().splitlines() or ["no output"])[-1][-200:]}
    row = measured(home / name, clients)
    cpu = CPU_LINE.search(log.read_text())
    if cpu and "failed" not in row:
        row.update(server_cpu_s=float(cpu.group(1)), client_cpu_ms=1000 * float(cpu.group(2)) / clients / 3)
    return row


def run_deployed(clients: int, secure: bool, shares: int, data_dir: str, home: Path) -> dict:
    """One run on a loopback TLS deployment of `clients` warm SuperNodes; the same figures as `run_one`."""
    from experiments.run.deployment import TLSSuperLink

    name = f"deployed-{'secagg' if secure else 'plain'}-{clients}"
    certs = home / f"{name}-certs"
    nodes = ",".join(f"node-{i}" for i in range(clients))
    repo = Path(__file__).resolve().parent.parent
    subprocess.run(
        [sys.executable, str(repo / "deploy/generate_certs.py"), "--out", str(certs), "--nodes", nodes],
        check=True,
        capture_output=True,
    )
    link = TLSSuperLink(home / f"{name}-home", certs).start()
    try:
        for i in range(clients):
            if link.register(certs / "nodes" / f"node-{i}.pub").returncode != 0:
                return {"failed": f"node-{i} could not be registered"}
        for i in range(clients):
            partition = f"partition-id={i} num-partitions={clients} state-dir='{home}/{name}-state-{i}'"
            link.start_supernode(certs / "nodes" / f"node-{i}", partition, warm=True)
        # each SuperNode takes its partition of the same 60-per-client subsample; a deployment with secure
        # aggregation gives up the per-upload bounds and says so
        config = {**run_config(clients, secure, shares, data_dir, home, name), "allow-unprotected": True}
        text = " ".join(f"{k}={json.dumps(v)}" for k, v in config.items())
        link.start_run(repo, text).wait(timeout=7200)
    finally:
        link.stop()
    return measured(home / name, clients)


def measured(folder_path: Path, clients: int) -> dict:
    """The finished run's median of rounds 2-3 (or why it did not finish)."""
    folder = RunFolder(folder_path)
    if not folder.finished():
        return {"failed": f"{folder_path.name} did not finish"}
    steady = [r for r in folder.rounds() if r["round"] > 1]
    secagg = [r["train"]["secagg"] for r in steady if "secagg" in r["train"]]
    return {
        "down_kb": statistics.median(r["bytes"]["train_down"] for r in steady) / clients / 1000,
        "up_kb": statistics.median(r["bytes"]["train_up"] for r in steady) / clients / 1000,
        "round_s": statistics.median(r["wall_s"] for r in steady),
        "secure_s": statistics.median(s["seconds"] for s in secagg) if secagg else None,
        "shares": secagg[0]["shares"] if secagg else None,
        "threshold": secagg[0]["threshold"] if secagg else None,
        "used": statistics.median(r["train"]["used"] for r in steady),
    }


def main() -> None:
    """Every cohort size with and without SecAgg+; print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--clients", default="10,100,1000")
    parser.add_argument("--shares", type=int, default=21, help="neighbours holding a client's shares, itself in")
    parser.add_argument("--workers", type=int, default=available_cores())
    parser.add_argument("--deployment", type=int, default=0, help="N > 0: a loopback TLS deployment of N SuperNodes")
    args = parser.parse_args()
    print(
        "| clients | secagg | shares / threshold | modulus | down / up a client (kB) | round (s) | secure stages (s) "
        "| server CPU, run (s) | ClientApp CPU a client a round (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    sizes = [args.deployment] if args.deployment else [int(c) for c in args.clients.split(",")]
    with tempfile.TemporaryDirectory(prefix="pflower-secagg-costs-") as tmp:
        for clients in sizes:
            for secure in (False, True):
                if args.deployment:
                    row = run_deployed(clients, secure, args.shares, args.data_dir, Path(tmp))
                else:
                    row = run_one(clients, secure, args.shares, args.data_dir, args.workers, Path(tmp))
                if "failed" in row:
                    print(f"| {clients} | {'yes' if secure else 'no'} | failed: {row['failed']} |||||||")
                    continue
                shares = f"{row['shares']} / {row['threshold']}" if secure else "-"
                modulus = f"2**{modulus_for(clients).bit_length() - 1}" if secure else "-"
                stages = f"{row['secure_s']:.1f}" if row["secure_s"] is not None else "-"
                cpu = f"{row['server_cpu_s']:.1f} | {row['client_cpu_ms']:.0f}" if "server_cpu_s" in row else "- | -"
                print(
                    f"| {clients} | {'yes' if secure else 'no'} | {shares} | {modulus} | {row['down_kb']:.1f} / "
                    f"{row['up_kb']:.1f} | {row['round_s']:.1f} | {stages} | {cpu} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
