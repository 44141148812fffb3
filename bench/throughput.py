"""Training throughput: samples per second of wall time in a round, on each engine, against the raw training loop
on the same clients' data, all measured in one run (check that nothing else runs: a timing taken beside another
job is void).

The raw loop is the project's own training loop (common/learning/train.py) on one thread, client after client, from the
model's initialization: `alone` is its rate on one core times the workers (what the cores would give if running
together cost nothing), `together` its rate with every worker training at once (one process a core, caches and
memory bandwidth shared). A round's rate is (samples x local epochs) / the round's wall time (median over the rounds
after the first; the evaluating last round left out); each engine's share is its rate over the raw loop's. Runs
write no checkpoints (`checkpoint-every=0`): writing one costs the disk's time, the same on every engine (FedAMP's
holds every client's model: 0.67 GB at 100 clients).

  in-process  pflower's in-process engine (experiments/engine): the server and one worker process a core
  simulation  `flwr run` on a private SuperLink, Flower's Ray simulation, one client a core
  bare        (--bare) a FedAvg built only from Flower's classes (bench/bare_fedavg) on the same simulation: what
              Flower's runtime leaves of the raw loop with none of this project's work

Two settings:

  grouped  FedAMP's grouped MNIST: 100 clients, all per round, 1 epoch, batch 100, cnn-mnist
  fmnist   Fashion-MNIST Dir(0.3): 50 clients, 10 per round, 2 epochs, batch 64, cnn-mnist

    python bench/throughput.py --data-dir ../shared/data [--setting grouped] [--algorithms fedavg,fedamp,dmpfl]
    python bench/throughput.py --engines inprocess,simulation --bare     # every column
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

from experiments.benchmarks.measure import raw_rate, raw_rate_together, round_rate
from experiments.engine.serve import available_cores, serve
from experiments.run.presets import run_config_text
from experiments.run.superlink import LocalSuperLink

BENCH = Path(__file__).resolve().parent
SETTINGS = {
    "grouped": {
        "dataset": "mnist",
        "partition": "grouped",
        "clients": 100,
        "fraction-train": 1.0,
        "local-epochs": 1,
        "batch-size": 100,
    },
    "fmnist": {
        "dataset": "fashion-mnist",
        "partition": "dirichlet",
        "clients": 50,
        "fraction-train": 0.2,
        "local-epochs": 2,
        "batch-size": 64,
    },
}


def in_process(raw: dict, clients: int, workers: int, results: Path) -> dict:
    """The run on the in-process engine, in this process (the server) and `workers` worker processes."""
    if not serve({**raw, "results-dir": str(results)}, clients, workers):
        sys.exit(f"{raw['algorithm']} failed on the in-process engine (see the log above)")
    return round_rate(results / raw["run-name"], raw["local-epochs"])


def simulated(link: LocalSuperLink, raw: dict, clients: int, results: Path, app: Path) -> dict:
    """The run through `flwr run` on the Ray simulation."""
    outcome = link.run(app, run_config_text({**raw, "results-dir": str(results)}), num_supernodes=clients, timeout=3600)
    if outcome.status != "finished:completed":
        sys.exit(f"{raw['algorithm']} failed on the simulation ({outcome.status}):\n{outcome.output[-3000:]}")
    return round_rate(results / raw["run-name"], raw["local-epochs"])


def bare_flower(link: LocalSuperLink, raw: dict, clients: int, results: Path) -> dict:
    """The same setting on a FedAvg built only from Flower's classes (bench/bare_fedavg)."""
    import json
    import statistics

    times = results / "bare-round-times.jsonl"
    own = ("algorithm", "run-name", "eval-every", "pretrain-epochs", "client-threads", "checkpoint-every")
    config = {
        **{k: v for k, v in raw.items() if k not in own},
        "fraction-evaluate": 0.0,
        "round-times": str(times),
    }
    outcome = link.run(BENCH / "bare_fedavg", run_config_text(config), num_supernodes=clients, timeout=3600)
    if outcome.status != "finished:completed":
        sys.exit(f"bare Flower FedAvg failed ({outcome.status}):\n{outcome.output[-3000:]}")
    rounds = [r for r in map(json.loads, times.read_text().splitlines()) if r["kind"] == "train"]
    steady = [r for r in rounds if r["round"] > 1] or rounds
    return {
        "rate": statistics.median(r["num_examples"] * raw["local-epochs"] / r["wall_s"] for r in steady),
        "round_s": statistics.median(r["wall_s"] for r in steady),
        "first_round_s": rounds[0]["wall_s"],
    }


def main() -> None:
    """Measure the raw loop, run each algorithm on each engine, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="grouped")
    parser.add_argument("--algorithms", default="fedavg,fedamp,dmpfl")
    parser.add_argument("--engines", default="inprocess", help="comma-separated: inprocess, simulation")
    parser.add_argument("--bare", action="store_true", help="also Flower's own FedAvg on the simulation")
    parser.add_argument("--data-dir", default=str(BENCH.parent.parent / "shared" / "data"))
    parser.add_argument("--model", default="cnn-mnist")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--workers", type=int, default=available_cores(), help="cores to use (default: all)")
    parser.add_argument("--extra", default="", help="more run-config overrides, KEY=VALUE separated by spaces")
    args = parser.parse_args()
    if args.rounds < 3:  # round 1 warms up and the last one also evaluates: neither is a steady round
        parser.error(f"--rounds must be at least 3 (a steady round besides the first and the last), got {args.rounds}")
    engines = [e for e in args.engines.split(",") if e]
    if set(engines) - {"inprocess", "simulation"}:
        parser.error(f"--engines takes inprocess and/or simulation, got {args.engines}")
    setting = dict(SETTINGS[args.setting])
    clients = setting.pop("clients")
    base = {
        **setting,
        "data-dir": str(Path(args.data_dir).resolve()),
        "model": args.model,
        "lr": 0.05,
        "num-rounds": args.rounds,
        "eval-every": args.rounds,
        "pretrain-epochs": 0,
        "client-threads": 1,
        "checkpoint-every": 0,  # checkpoints cost the disk's time, the same on every engine: not measured here
    }
    from experiments.run.runs import parse_assignment

    base.update(dict(parse_assignment(item) for item in args.extra.split()))
    alone = raw_rate({**base, "algorithm": "fedavg"}, clients) * args.workers
    together = raw_rate_together({**base, "algorithm": "fedavg"}, clients, args.workers)
    print(
        f"raw training loop: {alone:,.0f} samples/s alone x {args.workers} workers, {together:,.0f} with all "
        f"{args.workers} training at once",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="throughput-") as tmp:
        results = Path(tmp)  # run folders with checkpoints and client state: removed at the end
        link = LocalSuperLink(results / "flwr-home").start() if ("simulation" in engines or args.bare) else None
        try:
            for algorithm in args.algorithms.split(","):
                for engine in engines:
                    raw = {**base, "algorithm": algorithm, "run-name": f"{algorithm}-{engine}"}
                    if engine == "inprocess":
                        out = in_process(raw, clients, args.workers, results)
                    else:
                        assert link is not None
                        out = simulated(link, raw, clients, results, BENCH.parent)
                    rows.append((algorithm, engine, out))
                    print(
                        f"{algorithm} on {engine}: {out['rate']:,.0f} samples/s, {out['round_s']:.2f} s a round",
                        flush=True,
                    )
            if args.bare:
                assert link is not None
                out = bare_flower(link, {**base, "run-name": "bare"}, clients, results)
                rows.append(("Flower's own FedAvg (bare)", "simulation", out))
                print(f"bare Flower FedAvg: {out['rate']:,.0f} samples/s, {out['round_s']:.2f} s a round", flush=True)
        finally:
            if link is not None:
                link.stop()
    print(
        f"\n{args.setting}: {setting['dataset']} {setting['partition']}, {clients} clients, "
        f"{setting['fraction-train']:.0%} per round, {setting['local-epochs']} epoch(s), batch "
        f"{setting['batch-size']}, {args.model}, {args.rounds} rounds, {args.workers} workers of one thread\n"
    )
    print(
        f"raw loop: alone x {args.workers} = {alone:,.0f} samples/s; all {args.workers} at once = {together:,.0f} "
        "samples/s\n"
    )
    print(
        "| algorithm | engine | samples/s | share of raw loop (alone x workers) | share of raw loop (at once) "
        "| s per round (median) | first round (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for algorithm, engine, out in rows:
        share_alone = out["rate"] / alone if alone else math.nan
        share_together = out["rate"] / together if together else math.nan
        print(
            f"| {algorithm} | {engine} | {out['rate']:,.0f} | {share_alone:.1%} | {share_together:.1%} "
            f"| {out['round_s']:.2f} | {out['first_round_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
