"""FLIU's MNIST comparison (the FLIU paper's Tables I and III): stages L1, L2 and G with Acc(L), Acc(G) and Acc, for
FedAvg, Local, FedFomo, FLIU with the adaptive gamma (Eq. 4) and FLIU with a fixed gamma, on PATH and LSQS with
K = 10 and K = 100 clients. The paper's Table I is K = 100 without FedFomo; its Table III has FedFomo at K = 10 and
100, stage L2 only, and no PATH block.

The same experiments as a sweep: bench/sweeps/fliu_mnist.toml (PFL_DATA_DIR=... pflower sweep
bench/sweeps/fliu_mnist.toml; pflower report results/fliu_mnist/path-10-*-seed0 --baseline path-10-fedavg, per setting).

The paper runs T = 100 rounds with every client, B = 50, E = 5, lr 0.01 (decay 0.99). On this CPU the default
is a preset: a seeded 5,000-sample subset of MNIST (`max-samples`), 10 rounds, half of the clients per round
with K = 10 and 10% with K = 100, E = 2, Adam (FLIU [arXiv:2510.24503] Alg. 1) at lr 1e-3 (the paper: 0.01 with
decay 0.99), Dirichlet alpha = 1 for LSQS (the paper's figures). Acc(G) is measured on a seeded 500-sample subset
of the pooled test set (`stage-test-size`): the stage evaluations (up to four models per client per round)
otherwise cost more than the training on this CPU.

    python bench/fliu_mnist.py [--data-dir ../shared/data] [--rounds 10] [--settings path-10,lsqs-100]


Paper: Hussaini, Theiss, Stein, "Local Performance vs. Out-of-Distribution Generalization: An Empirical Analysis of
Personalized Federated Learning in Heterogeneous Data Environments", arXiv:2510.24503."""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments.benchmarks.compare import main

ALGORITHMS = "fedavg,local,fedfomo,fliu,fliu-gamma0.5:fliu[fliu-gamma=0.5]"
SETTINGS = {  # name: (partition, clients, fraction)
    "path-10": ("pathological", 10, 0.5),
    "lsqs-10": ("lsqs", 10, 0.5),
    "path-100": ("pathological", 100, 0.1),
    "lsqs-100": ("lsqs", 100, 0.1),
}


def run() -> None:
    """One compare.py table per setting."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--data-dir", default=str(Path(__file__).resolve().parent.parent.parent / "shared" / "data"))
    parser.add_argument("--rounds", default="10")
    parser.add_argument("--max-samples", default="5000")
    parser.add_argument("--stage-test-size", default="500")
    args, rest = parser.parse_known_args()
    for name in args.settings.split(","):
        partition, clients, fraction = SETTINGS[name]
        print(f"\n## {name}: {partition}, K = {clients}, {100 * fraction:g}% per round", flush=True)
        main(
            [
                "--algorithms",
                ALGORITHMS,
                "--dataset",
                "mnist",
                "--data-dir",
                args.data_dir,
                "--partition",
                partition,
                "--alpha",
                "1.0",
                "--clients",
                str(clients),
                "--rounds",
                args.rounds,
                "--fraction",
                str(fraction),
                "--epochs",
                "2",
                "--batch-size",
                "50",
                "--lr",
                "0.001",
                "--eval-every",
                args.rounds,
                "--extra",
                f"optimizer='adam' stages=true max-samples={args.max_samples} stage-test-size={args.stage_test_size}",
                *rest,
            ]
        )


if __name__ == "__main__":
    run()
