"""DapperFL on the four-domain Digits benchmark (DapperFL [arXiv:2412.05823], Table 1 and Table 3):
FedAvg, FedProx, DapperFL and its three ablations, 10 clients over the domains, three seeds.

The same experiments as a sweep: bench/sweeps/dapperfl_digits.toml (PFL_DATA_DIR=... pflower sweep
bench/sweeps/dapperfl_digits.toml; pflower report results/dapperfl_digits).

The global model's accuracy on each domain's held-out test data and their mean ("global accuracy"), mean +/- std
over the seeds, beside the paper's Table 1 (its SVHN and SYN are our MNIST-M-style and SYN-style domains:
docs/algorithms.md on DapperFL); then MB and training FLOPs per client and round by pruning ratio
(DapperFL, first seed). Paper settings: 1% of each domain per client, 100 rounds of 5 epochs, SGD lr 0.01 momentum
0.9 wd 1e-5, batch 64, ResNet10. CPU preset: `resnet10-s` (quarter widths), 20 rounds.

    python bench/dapperfl_digits.py [--data-dir ../shared/data] [--rounds 20] [--seeds 0,1,2]
Further flags go to bench/compare.py.


Paper: Jia et al., "DapperFL: Domain Adaptive Federated Learning with Model Fusion Pruning for Edge Devices", NeurIPS
2024, arXiv:2412.05823."""

from __future__ import annotations

import argparse

import numpy as np

from common.data.domains import DOMAINS
from common.storage.run_folder import final_means
from experiments.benchmarks.compare import compare_args, main

RUNS = {  # name: (title, algorithm[overrides])
    "fedavg": ("FedAvg", "fedavg"),
    "fedprox": ("FedProx", "fedprox[proximal-mu=0.1]"),
    "dapperfl-plain": ("DapperFL w/o MFP+DAR", "dapperfl[dapperfl-mfp=false dapperfl-dar=false]"),
    "dapperfl-nodar": ("DapperFL w/o DAR", "dapperfl[dapperfl-dar=false]"),
    "dapperfl-nomfp": ("DapperFL w/o MFP", "dapperfl[dapperfl-mfp=false]"),
    "dapperfl": ("DapperFL", "dapperfl"),
}
PAPER = {  # Table 1 (MNIST, USPS, SVHN, SYN, global) and Table 3 (global)
    "fedavg": (95.89, 86.84, 78.39, 33.63, 71.81),
    "fedprox": (96.68, 83.96, 76.69, 30.95, 70.74),
    "dapperfl-plain": (None, None, None, None, 71.94),
    "dapperfl-nodar": (None, None, None, None, 72.37),
    "dapperfl-nomfp": (None, None, None, None, 73.34),
    "dapperfl": (96.25, 86.30, 82.45, 37.26, 74.30),
}
DEFAULTS = compare_args(
    algorithms=",".join(f"{name}:{spec}" for name, (_, spec) in RUNS.items()),
    dataset="digit-domains",
    partition="domains",
    clients=10,
    rounds=20,
    fraction=1.0,
    epochs=5,
    batch_size=64,
    lr=0.01,
    eval_every=20,
    extra="model='resnet10-s' momentum=0.9 weight-decay=1e-5 shift-degrees='0'",
)


def domain_accuracies(summary: dict) -> list[float]:
    """The global model's accuracy (%) per domain and their mean."""
    mean = final_means(summary)
    per_domain = [100 * mean.get(f"domain-{name}-acc", float("nan")) for name in DOMAINS]
    return [*per_domain, float(np.mean(per_domain))]


def table(by_seed: list[dict[str, dict]]) -> str:
    """Markdown: per run, each domain and the global accuracy, mean +/- std over seeds, with the paper's."""
    lines = [
        "| run | " + " | ".join(DOMAINS) + " | global accuracy | paper (MNIST, USPS, SVHN, SYN, global) |",
        "|---|" + "---|" * (len(DOMAINS) + 2),
    ]
    for name, (title, _) in RUNS.items():
        rows = np.array([domain_accuracies(s[name]) for s in by_seed if name in s])
        if not len(rows):
            continue
        cells = [f"{m:.2f} +/- {d:.2f}" for m, d in zip(rows.mean(axis=0), rows.std(axis=0))]
        paper = ", ".join("-" if v is None else f"{v:.2f}" for v in PAPER[name])
        lines.append(f"| {title} | " + " | ".join(cells) + f" | {paper} |")
    return "\n".join(lines)


def ratio_table(summary: dict) -> str:
    """Markdown: DapperFL's per-client costs by pruning ratio."""
    lines = ["| ratio | values uploaded | training FLOPs per client-round | MB up | MB down |", "|---|---|---|---|---|"]
    for ratio, row in sorted(summary.get("by_ratio", {}).items(), key=lambda item: float(item[0])):
        lines.append(
            f"| {ratio} | {row['values']:,} | {row['train_flops']:.3e} | {row['mb_up']:.3f} | {row['mb_down']:.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--seeds", default="0,1,2")
    known, rest = parser.parse_known_args()
    by_seed = []
    for seed in [int(s) for s in known.seeds.split(",")]:
        by_seed.append(main(DEFAULTS + ["--seed", str(seed)] + rest))
    print(f"\nGlobal model per domain and global accuracy (%), mean +/- std over seeds {known.seeds}:")
    print(table(by_seed))
    print("\nDapperFL, per client and round by pruning ratio (first seed):")
    print(ratio_table(by_seed[0]["dapperfl"]))
