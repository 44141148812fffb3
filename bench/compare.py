"""Run several algorithms on one federated setting and print accuracy at every shift degree, costs and time.

Each algorithm runs through `flwr run` on a private local SuperLink with the same seed, data, partition
and rounds; the table is read from each run's summary.json.

    python bench/compare.py --algorithms fedavg,local --dataset mnist --data-dir ../shared/data \\
        --clients 100 --rounds 30 --fraction 0.1 --epochs 5 --batch-size 64 --lr 0.05 --eval-every 5
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from server_app.local_superlink import LocalSuperLink  # noqa: E402


def _pct(mean: float, std: float) -> str:
    return "n/a" if math.isnan(mean) else f"{100 * mean:.2f} +/- {100 * std:.2f}"


def table(summaries: dict[str, dict]) -> str:
    """Markdown table: one row per algorithm, accuracy mean +/- std per shift degree, best, MB, time."""
    first = next(iter(summaries.values()))
    degrees = first["shift_degrees"]
    lines = ["| algorithm | " + " | ".join(f"shift {100 * d:g}%" for d in degrees)
             + " | best mean (no shift) | train MB/client (down+up) | wall (s) |",
             "|---|" + "---|" * (len(degrees) + 3)]
    for name, s in summaries.items():
        final = s["final"]
        cells = [_pct(final["mean"][f"acc-shift-{d:g}"], final["std"][f"acc-shift-{d:g}"]) for d in degrees]
        mb = s["mb_per_client"]["train_down"] + s["mb_per_client"]["train_up"]
        lines.append(f"| {name} | " + " | ".join(cells)
                     + f" | {100 * s['best_mean_accuracy']:.2f} | {mb:.2f} | {s['wall_seconds']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    """Run the algorithms one after another and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", default="fedavg,local")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--partition", default="dirichlet")
    parser.add_argument("--alpha", type=float, default=0.3)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--extra", default="", help="more run-config overrides, e.g. \"proximal-mu=0.01\"")
    parser.add_argument("--results-dir", default=str(REPO / "results"))
    args = parser.parse_args()
    data_dir = str(Path(args.data_dir).resolve()) if args.data_dir else ""
    results = Path(args.results_dir).resolve() / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    base = (f"dataset='{args.dataset}' data-dir='{data_dir}' partition='{args.partition}' "
            f"dirichlet-alpha={args.alpha} num-rounds={args.rounds} fraction-train={args.fraction} "
            f"local-epochs={args.epochs} batch-size={args.batch_size} lr={args.lr} eval-every={args.eval_every} "
            f"seed={args.seed} results-dir='{results}' {args.extra}")
    summaries: dict[str, dict] = {}
    with LocalSuperLink(results / "flwr-home") as link:
        for name in args.algorithms.split(","):
            started = time.monotonic()
            outcome = link.run(REPO, f"{base} algorithm='{name}' run-name='{name}'", num_supernodes=args.clients,
                               timeout=24 * 3600)
            if outcome.status != "finished:completed":
                sys.exit(f"{name} failed ({outcome.status}):\n{outcome.output[-3000:]}")
            summaries[name] = json.loads((results / name / "summary.json").read_text())
            print(f"{name}: done in {time.monotonic() - started:.0f} s", flush=True)
    print()
    print(f"{args.dataset}, {args.partition}({args.alpha}), {args.clients} clients, {args.fraction:.0%} per round, "
          f"{args.rounds} rounds, {args.epochs} local epochs, seed {args.seed}; accuracy (%) mean +/- std over "
          f"clients at the last evaluated round")
    print(table(summaries))
    print(f"\nresults: {results}")


if __name__ == "__main__":
    main()
