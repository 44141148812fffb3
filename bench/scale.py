"""Scale on one machine: seconds per round, the evaluation round of every client and the peak memory of the whole
process tree (SuperLink, ServerApp, Ray and its workers) with many simulated clients.

Setting (issue 18): MNIST, Dirichlet(alpha), 10% of the clients per round, 1 local epoch, batch 32, cnn-mnist,
4 rounds, every client evaluated after the last one. Memory is sampled every 0.5 s from /proc: `RSS` is all
resident memory (memory-mapped files included: FedAMP's model store is such a file, which the kernel can drop
under pressure), `anon` only the private memory that cannot be dropped. FedAvg's training rounds are also given
as a share of the raw training loop (bench/throughput.py's, times the workers).

    python bench/scale.py --data-dir ../shared/data [--clients 1000] [--alphas 0.3,1.0]
                          [--algorithms fedavg,dmpfl,fedamp] [--model cnn-mnist]
    python bench/scale.py --data-dir ../shared/data --clients 10000 --model mlp --algorithms fedavg
    python bench/scale.py --data-dir ../shared/data --alphas 1.0 --algorithms fedavg --bare   # beside Flower's own
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.throughput import bare_rounds, raw_rate  # noqa: E402
from experiments.presets import run_config_text  # noqa: E402
from experiments.superlink import LocalSuperLink, descendants  # noqa: E402


def tree_memory(pid: int) -> tuple[int, int]:
    """(RSS, anonymous RSS) in bytes summed over `pid` and every process below it."""
    rss = anon = 0
    for proc in [pid, *descendants(pid)]:
        try:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{proc}/status").read_text().splitlines()
                          if ":" in line)
        except OSError:
            continue
        rss += int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
        anon += int(fields.get("RssAnon", "0 kB").split()[0]) * 1024
    return rss, anon


class PeakMemory:
    """Samples a process tree's memory in a thread; `peak` holds the largest (RSS, anon) seen."""

    def __init__(self, pid: int, every: float = 0.5) -> None:
        self.pid, self.every, self.peak = pid, every, (0, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss, anon = tree_memory(self.pid)
            self.peak = (max(self.peak[0], rss), max(self.peak[1], anon))
            self._stop.wait(self.every)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_one(config: dict, clients: int, home: Path, ray_cpus: int = 0) -> dict:
    """One simulation on its own SuperLink; seconds per training round, the evaluation round, peak memory."""
    with LocalSuperLink(home) as link:
        assert link.process is not None
        with PeakMemory(link.process.pid) as memory:
            started = time.monotonic()
            outcome = link.run(REPO, run_config_text(config), num_supernodes=clients, timeout=7200,
                               ray_cpus=ray_cpus)
            total = time.monotonic() - started
    run_dir = Path(config["results-dir"]) / config["run-name"]
    if outcome.status != "finished:completed" or not (run_dir / "summary.json").is_file():
        return {"failed": (outcome.output.strip().splitlines() or ["no output"])[-1][-200:], "peak": memory.peak}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    training = [r for r in records if not r.get("eval")]
    steady = [r for r in training if r["round"] > 1] or training
    round_s = statistics.median(r["wall_s"] for r in steady)
    last = records[-1]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"round_s": round_s, "first_s": records[0]["wall_s"], "eval_s": last["wall_s"] - round_s,
            "samples": statistics.median(r["train"]["num_examples"] for r in steady), "total_s": total,
            "evaluated": (last.get("eval") or {}).get("num_clients", 0), "peak": memory.peak,
            "accuracy": (summary.get("final") or {}).get("mean", {}).get("acc-shift-0", float("nan"))}


def run_bare(config: dict, clients: int, home: Path, ray_cpus: int = 0) -> dict:
    """The same setting on a FedAvg built only from Flower's classes (bench/bare_fedavg), evaluating every client
    (on its test split, no shift) after every round: what the runtime costs with none of this project's work."""
    times = Path(config["results-dir"]) / "bare-round-times.jsonl"
    own = {k: v for k, v in config.items() if k not in ("algorithm", "run-name", "eval-every", "shift-degrees",
                                                       "checkpoint-every", "results-dir")}
    with LocalSuperLink(home) as link:
        assert link.process is not None
        with PeakMemory(link.process.pid) as memory:
            started = time.monotonic()
            outcome = link.run(REPO / "bench" / "bare_fedavg",
                               run_config_text({**own, "fraction-evaluate": 1.0, "round-times": str(times)}),
                               num_supernodes=clients, timeout=7200, ray_cpus=ray_cpus)
            total = time.monotonic() - started
    if outcome.status != "finished:completed":
        return {"failed": (outcome.output.strip().splitlines() or ["no output"])[-1][-200:], "peak": memory.peak}
    training, evaluations = bare_rounds(times)
    steady = [r for r in training if r["round"] > 1] or training
    return {"round_s": statistics.median(r["wall_s"] for r in steady), "first_s": training[0]["wall_s"],
            "eval_s": statistics.median(r["wall_s"] for r in evaluations), "total_s": total,
            "samples": statistics.median(r["num_examples"] for r in steady),
            "evaluated": evaluations[-1]["replies"], "peak": memory.peak, "accuracy": float("nan")}


def main() -> None:
    """Run every algorithm at every alpha; print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--alphas", default="0.3,1.0")
    parser.add_argument("--algorithms", default="fedavg,dmpfl,fedamp")
    parser.add_argument("--model", default="cnn-mnist")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="the cores the raw loop's rate is multiplied by")
    parser.add_argument("--ray-cpus", type=int, default=0, help="CPUs Ray is told the machine has (0: its cores); "
                        "more than the cores runs that many clients at once")
    parser.add_argument("--shift-degrees", default="0,0.5,1", help="shift degrees each client is evaluated at: "
                        "any above 0 adds a forward pass over as many pool draws as the client has test samples")
    parser.add_argument("--bare", action="store_true", help="also run a FedAvg built only from Flower's classes "
                        "(bench/bare_fedavg) at each alpha, evaluating every client after every round (the median "
                        "of those): the runtime's own cost")
    args = parser.parse_args()
    base = {"dataset": "mnist", "data-dir": str(Path(args.data_dir).resolve()), "partition": "dirichlet",
            "num-rounds": args.rounds, "fraction-train": 0.1, "local-epochs": 1, "batch-size": 32, "lr": 0.05,
            "eval-every": args.rounds, "model": args.model, "shift-degrees": args.shift_degrees, "checkpoint-every": 0}
    raw = raw_rate({**base, "dirichlet-alpha": 1.0}, args.clients) * args.workers
    print(f"raw training loop: {raw:,.0f} samples/s ({args.workers} workers)", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pflower-scale-") as tmp:
        for alpha in [float(a) for a in args.alphas.split(",")]:
            for algorithm in args.algorithms.split(","):
                name = f"{algorithm}-a{alpha:g}"
                config = {**base, "algorithm": algorithm, "dirichlet-alpha": alpha, "results-dir": tmp,
                          "run-name": name}
                result = run_one(config, args.clients, Path(tmp) / f"home-{name}", args.ray_cpus)
                rows.append((algorithm, alpha, result))
                print(name, json.dumps(result), flush=True)
            if args.bare:
                name = f"bare-a{alpha:g}"
                config = {**base, "dirichlet-alpha": alpha, "results-dir": tmp, "run-name": name}
                result = run_bare(config, args.clients, Path(tmp) / f"home-{name}", args.ray_cpus)
                rows.append(("bare Flower FedAvg", alpha, result))
                print(name, json.dumps(result), flush=True)
    print(f"\n{args.clients} clients, {args.model}, MNIST Dir(alpha), 10% per round, 1 epoch, batch 32, "
          f"{args.rounds} rounds, every client evaluated after the last at shift degrees {args.shift_degrees} "
          "(bare Flower: after every round, no shift)\n")
    print("| algorithm | alpha | s / training round | share of raw loop | evaluation round (s) | clients evaluated "
          "| peak RSS (GiB) | peak anon (GiB) | accuracy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for algorithm, alpha, r in rows:
        rss, anon = (v / 2**30 for v in r["peak"])
        if "failed" in r:
            print(f"| {algorithm} | {alpha:g} | failed: {r['failed']} | | | | {rss:.2f} | {anon:.2f} | |")
            continue
        share = r["samples"] / r["round_s"] / raw
        accuracy = "-" if math.isnan(r["accuracy"]) else f"{100 * r['accuracy']:.2f}"
        print(f"| {algorithm} | {alpha:g} | {r['round_s']:.1f} | {100 * share:.0f}% | {r['eval_s']:.1f} | "
              f"{r['evaluated']} | {rss:.2f} | {anon:.2f} | {accuracy} |")


if __name__ == "__main__":
    main()
