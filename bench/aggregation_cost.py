"""Server cost of one aggregation: plain sample-weighted average against norm clipping, trimmed mean and median,
for K uploads of the MNIST CNN (1.66M parameters). Median of repeated calls, in one process; run it on an idle
machine.

    python bench/aggregation_cost.py [--clients 20] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from common.learning.models import array_specs, build_model
from common.methods.robust import ROBUST_METHODS, RobustRule, robust_average


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    specs = array_specs(build_model("cnn-mnist", "mnist", (1, 28, 28), 10, seed=0))
    rng = np.random.default_rng(0)
    reference = [rng.standard_normal(shape).astype(np.float32) for _, shape in specs]
    models = [
        [r + 0.01 * rng.standard_normal(r.shape).astype(np.float32) for r in reference] for _ in range(args.clients)
    ]
    weights = rng.integers(100, 1000, size=args.clients).tolist()
    times = {}
    for method in ROBUST_METHODS:
        samples = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            robust_average(models, weights, reference, RobustRule(method))
            samples.append(time.perf_counter() - started)
        times[method] = statistics.median(samples)
    print(
        f"{args.clients} uploads of the MNIST CNN ({sum(int(np.prod(s)) for _, s in specs):,} parameters), median "
        f"of {args.repeats} calls:"
    )
    print("| rule | ms per aggregation | vs plain average |\n|---|---|---|")
    for method, seconds in times.items():
        print(f"| {method} | {1e3 * seconds:.0f} | {seconds / times['none']:.1f}x |")


if __name__ == "__main__":
    main()
