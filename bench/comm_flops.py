"""Measured communication and training FLOPs per client: FedAvg, FedDST, DM-PFL on MNIST Dir(0.3), S = 0.5.

The same experiments as a sweep: bench/sweeps/comm_flops.toml (PFL_DATA_DIR=... pflower sweep
bench/sweeps/comm_flops.toml; pflower report results/comm_flops).

Prints MB per client (bytes of the serialized Flower messages) and training FLOPs per client with their ratios to
FedAvg (paper, CIFAR-10 Table 4: FedDST 51.2% of FedAvg's bytes, DM-PFL 40.3% of the bytes and 63.9% of the
FLOPs), and DM-PFL twice: with `partial-download` (phases 1 and 3 send w_g on m_g AND m_c only) and with whole
downloads ("dmpfl-whole"): the accuracy must be identical, only the bytes differ.

DM-PFL's bytes depend on how often a client comes back within one phase segment: w_g is fixed through phase 3,
so a client's second and later phase-3 participations in a segment download nothing. Two settings:
  --setting paper   20 clients, 50% per round, 60 rounds: every client trains ~30 times, ~3.3 times per phase
                    segment, as in the paper (100 clients, 10% per round, 300 rounds);
  --setting short   100 clients, 10% per round, 30 rounds: ~3 participations per client, ~0.3 per segment
                    (almost every phase-3 participation is a client's first of its segment).
Both give a client 700 samples on average (MNIST's 70,000 over 100 clients; max-samples=14000 over 20) and 5
local epochs unless --epochs says otherwise; bytes and FLOP ratios do not depend on the epochs.

    python bench/comm_flops.py [--data-dir ../shared/data] [--setting paper|short] [--epochs 1]
Further flags go to bench/compare.py (e.g. --seed 1).
"""

from __future__ import annotations

import sys

from shift_mnist import DEFAULTS

from experiments.benchmarks.compare import main, merge_config

ALGORITHMS = "fedavg,feddst,dmpfl,dmpfl-whole:dmpfl[partial-download=false]"
SETTINGS = {
    "paper": ["--clients", "20", "--fraction", "0.5", "--rounds", "60", "--eval-every", "60"],
    "short": ["--clients", "100", "--fraction", "0.1", "--rounds", "30", "--eval-every", "30"],
}
MAX_SAMPLES = {"paper": 14_000, "short": 0}  # 700 per client on average in both


def arguments(argv: list[str]) -> list[str]:
    """compare.py's arguments: shift_mnist's defaults, the chosen setting, then the caller's flags."""
    setting = "paper"
    if "--setting" in argv:
        at = argv.index("--setting")
        setting = argv[at + 1]
        argv = argv[:at] + argv[at + 2 :]
        if setting not in SETTINGS:
            sys.exit(f"--setting must be one of {', '.join(SETTINGS)}, got {setting!r}")
    args = list(DEFAULTS) + SETTINGS[setting]
    args[args.index("--algorithms") + 1] = ALGORITHMS
    at = args.index("--extra") + 1
    args[at] = merge_config(args[at], f"max-samples={MAX_SAMPLES[setting]}")
    return args + argv


if __name__ == "__main__":
    main(arguments(sys.argv[1:]))
