"""MNIST Dir(0.3), 100 clients, 10% per round: FedAvg, FedAvg+FT, FedDST, DM-PFL and DM-PFL+ at every shift degree.

The paper's Table 7 setting on this CPU: 30 rounds of 5 local epochs (batch 64, lr 0.05), S = 0.5, three
DM-PFL cycles. FedAvg+FT fine-tunes the final global model for 5 epochs on each client before evaluating.
Evaluation only after the last round, so the byte counts are not helped by evaluation traffic.

    python bench/shift_mnist.py [--data-dir ../shared/data] [--rounds 30]
Further flags go to bench/compare.py (e.g. --seed 1).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import main

DEFAULTS = ["--algorithms", "fedavg,fedavg-ft,feddst,dmpfl", "--dataset", "mnist",
            "--data-dir", str(Path(__file__).resolve().parent.parent.parent / "shared" / "data"),
            "--partition", "dirichlet", "--alpha", "0.3", "--clients", "100", "--rounds", "30",
            "--fraction", "0.1", "--epochs", "5", "--batch-size", "64", "--lr", "0.05", "--eval-every", "30",
            "--extra", "sparsity=0.5 iterations=3"]

if __name__ == "__main__":
    main(DEFAULTS + sys.argv[1:])
