"""Measured communication and training FLOPs per client: FedAvg, FedDST, DM-PFL on MNIST Dir(0.3), S = 0.5.

The same experiments as a sweep: bench/sweeps/comm_flops.toml (PFL_DATA_DIR=... pflower sweep
bench/sweeps/comm_flops.toml; pflower report results/comm_flops).

100 clients, 10% per round, the same rounds for all; prints MB per client (bytes of the serialized Flower
messages) and training FLOPs per client with their ratios to FedAvg (paper, CIFAR-10 Table 4: FedDST 51.2%
of FedAvg's bytes, DM-PFL 40.3% of the bytes and 63.9% of the FLOPs).

    python bench/comm_flops.py [--data-dir ../shared/data] [--rounds 30]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import main
from shift_mnist import DEFAULTS

if __name__ == "__main__":
    args = list(DEFAULTS)
    args[args.index("--algorithms") + 1] = "fedavg,feddst,dmpfl"
    main(args + sys.argv[1:])
