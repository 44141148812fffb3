"""MNIST Dir(0.3), 100 clients, 10% per round: every algorithm of DM-PFL's Tables 1, 4 and 7 that fits (FedAvg,
FedAvg+FT, LG-FedAvg, FedPer, FedRep, Ditto, APFL, FedDST, DM-PFL and DM-PFL+) at every shift degree, with the
measured MB and training FLOPs per client and their ratios to FedAvg, then one table beside the paper's numbers.

The same experiments as a sweep: bench/sweeps/shift_mnist.toml (PFL_DATA_DIR=... pflower sweep
bench/sweeps/shift_mnist.toml; pflower report results/shift_mnist).

The paper's setting on this CPU: 5 local epochs (batch 64, lr 0.05), S = 0.5, three DM-PFL cycles, 30 rounds
(the paper runs 300). Evaluation only after the last round, so byte counts are not helped by evaluation traffic.

    python bench/shift_mnist.py [--data-dir ../shared/data] [--rounds 30]
Further flags go to bench/compare.py (e.g. --seed 1, --algorithms fedavg,ditto).


Paper: Zhang, Zhou, Wang, Tong, "DM-PFL: Hitchhiking Generic Federated Learning for Efficient Shift-Robust
Personalization", KDD 2023, doi:10.1145/3580305.3599311 (not on arXiv)."""

from __future__ import annotations

import math
import sys

from common.storage.run_folder import final_means, final_stds
from experiments.benchmarks.compare import compare_args, main

ALGORITHMS = "fedavg,fedavg-ft,lg-fedavg,fedper,fedrep,ditto,apfl,feddst,dmpfl"
DEFAULTS = compare_args(
    algorithms=ALGORITHMS,
    dataset="mnist",
    partition="dirichlet",
    alpha=0.3,
    clients=100,
    rounds=30,
    fraction=0.1,
    epochs=5,
    batch_size=64,
    lr=0.05,
    eval_every=30,
    extra="sparsity=0.5 iterations=3",
)

# DM-PFL [KDD 2023] Table 7 (MNIST Dir(0.3), 300 rounds): accuracy (%) without shift and at 100% shift
PAPER_MNIST = {
    "fedavg+ft": (98.91, 97.05),
    "lg-fedavg": (97.01, 60.18),
    "fedper": (99.08, 69.06),
    "fedrep": (99.10, 75.58),
    "ditto": (99.11, 96.87),
    "apfl": (99.22, 97.14),
    "dmpfl": (99.24, 97.76),
    "dmpfl+": (99.05, 98.22),
}
# DM-PFL [KDD 2023] Table 4 (CIFAR-10 Dir(0.3)): bytes and training FLOPs per client as fractions of FedAvg's
PAPER_COSTS = {
    "fedavg": (1.0, 1.0),
    "fedavg-ft": (1.0, 1.03),
    "lg-fedavg": (0.669, 1.0),
    "fedper": (0.997, 1.0),
    "fedrep": (0.997, 1.31),
    "ditto": (1.0, 2.01),
    "apfl": (1.0, 2.0),
    "feddst": (0.512, 0.637),
    "dmpfl": (0.403, 0.639),
}


def _rows(summaries: dict[str, dict]) -> list[tuple[str, str, dict, dict]]:
    """(label, algorithm, final mean, final std) for each run and for DM-PFL+ beside DM-PFL."""
    rows = []
    for name, s in summaries.items():
        mean = final_means(s)
        rows.append((name, name, mean, final_stds(s)))
        if "plus-acc-shift-0" in mean:
            plus = {k[len("plus-") :]: v for k, v in mean.items() if k.startswith("plus-")}
            rows.append((f"{name}+", name, plus, {}))
    return rows


def _total_mb(summary: dict) -> float:
    return summary["mb_per_client"]["train_down"] + summary["mb_per_client"]["train_up"]


def paper_table(summaries: dict[str, dict]) -> str:
    """Ours beside DM-PFL [KDD 2023] Table 7 (accuracy at 0% and 100% shift) and Table 4 (cost ratios to FedAvg)."""
    ref = summaries.get("fedavg")
    lines = [
        "| algorithm | ours 0% | paper 0% | ours 100% | paper 100% | bytes vs FedAvg (ours / paper) "
        "| FLOPs vs FedAvg (ours / paper) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, algorithm, mean, _ in _rows(summaries):
        paper = PAPER_MNIST.get("fedavg+ft" if label == "fedavg-ft" else label, (math.nan, math.nan))
        s = summaries[algorithm]
        if ref and label == algorithm:
            bytes_ratio = _total_mb(s) / _total_mb(ref)
            flops_ratio = s["train_flops_per_client"] / ref["train_flops_per_client"]
            paper_b, paper_f = PAPER_COSTS.get(label, (math.nan, math.nan))
            cost = f"{bytes_ratio:.3f} / {paper_b:.3f} | {flops_ratio:.3f} / {paper_f:.3f}"
        else:
            cost = "- | -"
        lines.append(
            f"| {label} | {100 * mean['acc-shift-0']:.2f} | {paper[0]:.2f} | {100 * mean['acc-shift-1']:.2f} "
            f"| {paper[1]:.2f} | {cost} |"
        )
    return "\n".join(lines).replace("| nan |", "| - |").replace("nan", "-")


if __name__ == "__main__":
    results = main(DEFAULTS + sys.argv[1:])
    print("\nBeside DM-PFL [KDD 2023] (Table 7: MNIST Dir(0.3), 300 rounds; Table 4: CIFAR-10 cost ratios):")
    print(paper_table(results))
