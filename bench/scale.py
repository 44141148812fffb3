"""Scale on one machine: seconds per training round, the evaluation of every client, and the peak memory of the whole
process tree, with many clients, on the in-process engine (default) or Flower's simulation.

Setting: MNIST, Dirichlet(alpha), 10% of the clients per round (--fraction), 1 local epoch, batch 32, cnn-mnist
(--model), 4 rounds, every client evaluated after the last one. Memory is sampled every 0.5 s from /proc: `RSS` is
all resident memory (memory-mapped files included: FedAMP's model store is such a file, which the kernel can drop
under pressure), `anon` only the private memory that cannot be dropped; both include the shared memory in use
(/dev/shm: the in-process engine's message blocks and the clients' state it holds between messages). `disk` is the
most the run's file system filled beyond its use at the start (client state spilled or checkpointed, FedAMP's model
store). A training round's rate is given as a share of the raw training loop's (experiments/benchmarks/measure.py:
its rate on one core alone, times the workers).

    python bench/scale.py --data-dir ../shared/data [--clients 1000] [--alphas 0.3,1.0]
                          [--algorithms fedavg,dmpfl,fedamp] [--engine inprocess|simulation]
    python bench/scale.py --data-dir ../shared/data --clients 10000 --fraction 0.01 --model cnn-cifar --alphas 0.3
    python bench/scale.py --data-dir ../shared/data --alphas 0.3 --algorithms fedamp,fedamp+pretrain-when=first-sampled

The evaluation's seconds are the round record's `evaluate_s` (the last round may also train: DM-PFL's Algorithm 3
trains every client in it); `last round` is that whole round.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common.storage.run_folder import RunFolder, evaluated_clients, evaluation, final_means
from experiments.benchmarks.measure import PeakMemory, raw_rate
from experiments.engine.serve import available_cores
from experiments.run.presets import run_config_text
from experiments.run.superlink import LocalSuperLink

REPO = Path(__file__).resolve().parent.parent  # the Flower app the simulation runs


def run_one(config: dict, clients: int, home: Path, engine: str, workers: int) -> dict:
    """One run on the engine; seconds per training round, the evaluation round, peak memory of the process tree."""
    started = time.monotonic()
    if engine == "inprocess":
        command = [
            sys.executable,
            "-m",
            "experiments.engine",
            "--run-config",
            json.dumps(config),
            "--clients",
            str(clients),
            "--workers",
            str(workers),
        ]
        log = home.with_suffix(".log")
        with log.open("w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
            with PeakMemory(process.pid, disk=home.parent) as memory:
                returncode = process.wait(timeout=7200)
        output, ok = log.read_text(), returncode == 0
    else:
        with LocalSuperLink(home) as link:
            assert link.process is not None
            with PeakMemory(link.process.pid, disk=home.parent) as memory:
                outcome = link.run(REPO, run_config_text(config), num_supernodes=clients, timeout=7200)
        output, ok = outcome.output, outcome.status == "finished:completed"
    total = time.monotonic() - started
    run_dir = Path(config["results-dir"]) / config["run-name"]
    if not ok or not RunFolder(run_dir).finished():
        failed = (output.strip().splitlines() or ["no output"])[-1][-200:]
        return {"failed": failed, "peak": memory.peak, "disk": memory.peak_disk}
    records = RunFolder(run_dir).rounds()
    training = [r for r in records if not evaluation(r)]
    steady = [r for r in training if r["round"] > 1] or training
    round_s = statistics.median(r["wall_s"] for r in steady)
    last = records[-1]
    # the evaluation alone (its last round may also train: DM-PFL's Algorithm 3 trains every client there)
    eval_s = last.get("evaluate_s", last["wall_s"] - round_s)
    summary = RunFolder(run_dir).summary()
    return {
        "round_s": round_s,
        "first_s": records[0]["wall_s"],
        "eval_s": eval_s,
        "last_s": last["wall_s"],
        "samples": statistics.median(r["train"]["num_examples"] for r in steady),
        "total_s": total,
        "evaluated": evaluated_clients(last),
        "peak": memory.peak,
        "disk": memory.peak_disk,
        "accuracy": final_means(summary).get("acc-shift-0", float("nan")),
    }


def main() -> None:
    """Run every algorithm at every alpha; print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--alphas", default="0.3,1.0")
    parser.add_argument(
        "--algorithms",
        default="fedavg,dmpfl,fedamp",
        help="comma-separated; an algorithm may carry run-config keys: fedamp+pretrain-when=first-sampled",
    )
    parser.add_argument("--model", default="cnn-mnist")
    parser.add_argument("--fraction", type=float, default=0.1, help="share of the clients trained in a round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--engine", choices=("inprocess", "simulation"), default="inprocess")
    parser.add_argument("--workers", type=int, default=available_cores(), help="cores to use (default: all)")
    parser.add_argument(
        "--shift-degrees",
        default="0,0.5,1",
        help="shift degrees each client is evaluated at: "
        "any above 0 adds a forward pass over as many pool draws as the client has test samples",
    )
    args = parser.parse_args()
    base = {
        "dataset": "mnist",
        "data-dir": str(Path(args.data_dir).resolve()),
        "partition": "dirichlet",
        "num-rounds": args.rounds,
        "fraction-train": args.fraction,
        "local-epochs": 1,
        "batch-size": 32,
        "lr": 0.05,
        "eval-every": args.rounds,
        "model": args.model,
        "shift-degrees": args.shift_degrees,
        "checkpoint-every": 0,
    }
    raw = raw_rate({**base, "dirichlet-alpha": 1.0}, args.clients) * args.workers
    print(f"raw training loop: {raw:,.0f} samples/s ({args.workers} workers)", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pflower-scale-") as tmp:
        for alpha in [float(a) for a in args.alphas.split(",")]:
            for index, variant in enumerate(args.algorithms.split(",")):
                algorithm, *keys = variant.split("+")
                name = f"{index}-{algorithm}-a{alpha:g}"
                config = {
                    **base,
                    "algorithm": algorithm,
                    **dict(key.split("=", 1) for key in keys),
                    "dirichlet-alpha": alpha,
                    "results-dir": tmp,
                    "run-name": name,
                }
                result = run_one(config, args.clients, Path(tmp) / f"home-{name}", args.engine, args.workers)
                rows.append((variant, alpha, result))
                print(variant, alpha, json.dumps(result), flush=True)
    print(
        f"\n{args.clients} clients on the {args.engine} engine ({args.workers} workers), {args.model}, MNIST "
        f"Dir(alpha), {args.fraction:.0%} per round ({round(args.clients * args.fraction)} clients), 1 epoch, "
        f"batch 32, {args.rounds} rounds, every client evaluated after the last "
        f"at shift degrees {args.shift_degrees}\n"
    )
    print(
        "| algorithm | alpha | first round (s) | s / training round | share of raw loop | evaluation of all clients "
        "(s) | x a training round | last round (s) | clients evaluated | peak RSS (GiB) | peak anon (GiB) | peak disk "
        "(GiB) | accuracy |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for algorithm, alpha, r in rows:
        rss, anon = (v / 2**30 for v in r["peak"])
        memory = f"{rss:.2f} | {anon:.2f} | {r['disk'] / 2**30:.2f}"
        if "failed" in r:
            print(f"| {algorithm} | {alpha:g} | failed: {r['failed']} | | | | | | | {memory} | |")
            continue
        share = r["samples"] / r["round_s"] / raw
        accuracy = "-" if math.isnan(r["accuracy"]) else f"{100 * r['accuracy']:.2f}"
        print(
            f"| {algorithm} | {alpha:g} | {r['first_s']:.1f} | {r['round_s']:.1f} | {100 * share:.0f}% | "
            f"{r['eval_s']:.1f} | {r['eval_s'] / r['round_s']:.1f} | {r['last_s']:.1f} | {r['evaluated']} | "
            f"{memory} | {accuracy} |"
        )


if __name__ == "__main__":
    main()
