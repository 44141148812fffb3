"""FedAMP's grouped "challenging non-IID" MNIST (the FedAMP paper's Sec. 4, Table 1): FedAvg, FedAvg-FT, Local, FedAMP,
HeurFedAMP, then FedAMP, HeurFedAMP and FedAvg-FT with 30% of each round's clients dropped and with dirty labels
(2 of 5 clients, 40% of their training labels flipped).

The same experiments as a sweep: bench/sweeps/fedamp_mnist.toml (PFL_DATA_DIR=... pflower sweep
bench/sweeps/fedamp_mnist.toml; pflower report results/fedamp_mnist).

100 clients in 5 groups of 20 (500/400/300/200/100 samples per client, 80% from two dominant classes), Adam
lr 1e-3 and batch 100 (the paper's), FedAMP sigma 100, HeurFedAMP sigma 25 and tau 0.95 (its appendix Table 2).
CPU preset: 20% of the clients per round, 2 local epochs (paper: 10) and 15 rounds, evaluation every 5 rounds
(FedAvg-FT, whose evaluation fine-tunes every client, only after the last). The "best mean" column is FedAMP's
metric: the best mean client accuracy over the evaluated rounds.

    python bench/fedamp_mnist.py [--data-dir ../shared/data] [--rounds 20]
Further flags go to bench/compare.py.


Paper: Huang et al., "Personalized Federated Learning: An Attentive Collaboration Approach" (FedAMP),
arXiv:2007.03797."""

from __future__ import annotations

import sys

from experiments.benchmarks.compare import compare_args, main

DROP = "drop-rate=0.3"
DIRTY = "dirty-clients=0.4 dirty-fraction=0.4"
FT = "eval-every=1000"  # evaluated after the last round only
ALGORITHMS = ",".join(
    [
        "fedavg",
        f"fedavg-ft[{FT}]",
        "local",
        "fedamp",
        "heurfedamp",
        f"fedavg-ft-drop30:fedavg-ft[{FT} {DROP}]",
        f"fedamp-drop30:fedamp[{DROP}]",
        f"heurfedamp-drop30:heurfedamp[{DROP}]",
        f"fedavg-ft-dirty:fedavg-ft[{FT} {DIRTY}]",
        f"fedamp-dirty:fedamp[{DIRTY}]",
        f"heurfedamp-dirty:heurfedamp[{DIRTY}]",
    ]
)
DEFAULTS = compare_args(
    algorithms=ALGORITHMS,
    dataset="mnist",
    partition="grouped",
    clients=100,
    rounds=15,
    fraction=0.2,
    epochs=2,
    batch_size=100,
    lr=0.001,
    eval_every=5,
    extra="optimizer='adam' fedamp-sigma=100.0 heurfedamp-sigma=25.0 heurfedamp-tau=0.95",
)

if __name__ == "__main__":
    main(DEFAULTS + sys.argv[1:])
