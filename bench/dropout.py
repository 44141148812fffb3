"""Dropouts on MNIST Dir(0.3): FedAvg, DM-PFL and FedAMP with 0, 10, 30 and 50% of each round's clients failing.

The same experiments as a sweep: bench/sweeps/dropout.toml (PFL_DATA_DIR=... pflower sweep bench/sweeps/dropout.toml;
pflower report results/dropout --baseline fedavg-drop0).

100 clients, 10% per round; the server tells a seeded round(rate * k) of the k sampled clients to fail
(run-config drop-rate), they raise, and the server aggregates what came back. CPU preset: 20 rounds of
2 local epochs (batch 64, SGD lr 0.05), DM-PFL with S = 0.5 and two cycles, FedAMP with one pre-training
epoch; evaluation after the last round only. The table gives the final mean +/- std client accuracy
(no shift) and the replies each round used, from each run's summary.json.

    python bench/dropout.py [--data-dir ../shared/data] [--rounds 20] [--resume results/compare-...]
Further flags go to bench/compare.py.
"""

from __future__ import annotations

import sys

from common.algorithms import CLOUD
from common.storage.run_folder import final_means, final_stds
from experiments.benchmarks.compare import compare_args, main

ALGORITHMS = {"fedavg": "FedAvg", "dmpfl": "DM-PFL", "fedamp": "FedAMP"}
RATES = (0.0, 0.1, 0.3, 0.5)
DEFAULTS = compare_args(
    algorithms=",".join(
        f"{algo}-drop{int(100 * rate)}:{algo}[drop-rate={rate}]" for algo in ALGORITHMS for rate in RATES
    ),
    dataset="mnist",
    partition="dirichlet",
    alpha=0.3,
    clients=100,
    rounds=20,
    fraction=0.1,
    epochs=2,
    batch_size=64,
    lr=0.05,
    eval_every=20,
    extra="sparsity=0.5 iterations=2 pretrain-epochs=1",
)


def dropout_table(summaries: dict[str, dict]) -> str:
    """Markdown: one row per algorithm, per drop rate the final accuracy and the replies used per round."""
    lines = ["| algorithm | " + " | ".join(f"drop {100 * r:g}%" for r in RATES) + " |", "|---|" + "---|" * len(RATES)]
    for algo, title in ALGORITHMS.items():
        for key, suffix in (("acc-shift-0", ""), (f"{CLOUD.prefix}acc-shift-0", f" ({CLOUD.label})")):
            cells = []
            for rate in RATES:
                s = summaries.get(f"{algo}-drop{int(100 * rate)}")
                if s is None or key not in final_means(s):
                    cells.append("-")
                    continue
                acc = f"{100 * final_means(s)[key]:.2f} +/- {100 * final_stds(s)[key]:.2f}"
                used, sent = sum(s["replies_used"]), sum(s["replies_sent"])
                per_round = "/".join(map(str, sorted(set(s["replies_used"]))))
                cells.append(acc if suffix else f"{acc} ({used}/{sent} replies used; per round {per_round})")
            if any(cell != "-" for cell in cells):
                lines.append(f"| {title}{suffix} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    results = main(DEFAULTS + sys.argv[1:])
    print("\nFinal mean client accuracy (%, no shift) by drop rate, and training replies used of those sent:")
    print(dropout_table(results))
