"""Simulation overhead: pflower's FedAvg vs a bare Flower FedAvg app (same model, data, rounds, clients).

Prints each run's wall time as the SuperLink reports it (running -> finished), the medians and the
ratio. Both apps run on one private local SuperLink, alternating, so they see the same machine state.

    python bench/sim_overhead.py                          # digits, no data needed
    python bench/sim_overhead.py --dataset mnist --data-dir ../shared/data --clients 20 --rounds 10
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from experiments.run.superlink import LocalSuperLink

REPO = Path(__file__).resolve().parent.parent  # the Flower app the simulation runs


def elapsed(link: LocalSuperLink, run_id: str) -> float:
    """Seconds from running to finished, as `flwr ls` reports them."""
    done = subprocess.run(
        ["flwr", "ls", "--run-id", run_id, "--format", "json"],
        env=link.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return float(json.loads(done.stdout)["runs"][0]["elapsed"])


def main() -> None:
    """Run both apps `--repeats` times each and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    data_dir = str(Path(args.data_dir).resolve()) if args.data_dir else ""
    common = (
        f"dataset='{args.dataset}' data-dir='{data_dir}' num-rounds={args.rounds} "
        f"fraction-train={args.fraction} local-epochs={args.epochs} batch-size=32 lr=0.05 seed=0"
    )
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as home, LocalSuperLink(Path(home)) as link:
        apps = {
            "bare Flower FedAvg": (REPO / "bench" / "bare_fedavg", common),
            "pflower fedavg": (
                REPO,
                f"{common} algorithm='fedavg' eval-every=1 fraction-evaluate=1.0 "
                f"results-dir='{Path(home) / 'results'}'",
            ),
        }
        times = {name: [] for name in apps}
        for repeat in range(args.repeats):
            for name, (app, config) in apps.items():
                outcome = link.run(app, config, num_supernodes=args.clients)
                if outcome.status != "finished:completed":
                    sys.exit(f"{name} failed ({outcome.status}):\n{outcome.output[-3000:]}")
                times[name].append(elapsed(link, outcome.run_id))
                print(f"repeat {repeat + 1}/{args.repeats}: {name}: {times[name][-1]:.1f} s", flush=True)
    bare = statistics.median(times["bare Flower FedAvg"])
    ours = statistics.median(times["pflower fedavg"])
    print()
    print(
        f"{args.dataset}, {args.clients} clients, {args.rounds} rounds, {args.fraction:.0%} per round, "
        f"{args.epochs} local epoch(s), every client evaluated every round"
    )
    print("| app | runs (s) | median (s) |")
    print("|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {', '.join(f'{v:.1f}' for v in values)} | {statistics.median(values):.1f} |")
    print(f"\nratio pflower / bare: {ours / bare:.3f} (target <= 1.15)")


if __name__ == "__main__":
    main()
