"""PFLlib side by side on identical clients: PFLlib's own code run on the clients of bench/sweeps/pfllib_setting.toml
(exported in its data format) with the same model, batch size, local epochs, learning rate and rounds; records under
docs/claims/pfllib-setting/pfllib/, the table in docs/pfllib_side_by_side.md.

    git clone https://github.com/TsingZ0/PFLlib ~/PFLlib            # read at d832e76
    pip install --target ~/pfllib-deps h5py scikit-learn calmsize ujson cvxpy   # what its main.py imports
    PFL_DATA_DIR=/path/to/shared/data python bench/pfllib_side_by_side.py run --pfllib ~/PFLlib \\
        --deps ~/pfllib-deps --budget-hours 2 --commit
    python bench/pfllib_side_by_side.py run ... --experiments fmnist-fedavg --rounds 2   # a trial, no record
    python bench/pfllib_side_by_side.py time --pfllib ~/PFLlib --deps ~/pfllib-deps --commit   # seconds a round,
                                                                          # both sides, nothing else running
    python bench/pfllib_side_by_side.py table

This project's side is the study itself: pflower sweep bench/sweeps/pfllib_setting.toml --budget 2h --commit.
"""

import subprocess
import sys
from pathlib import Path

import experiments
from experiments.benchmarks.pfllib import main

CHECKOUT = Path(__file__).resolve().parent.parent


def commit(path: Path, message: str) -> None:
    """Commit one record alone (a stopped run keeps every record written before it)."""
    subprocess.run(["git", "-C", str(path.parent), "add", str(path)], check=True)
    subprocess.run(["git", "-C", str(path.parent), "commit", "-q", "-m", message, "--", str(path)], check=True)


if __name__ == "__main__":
    installed = Path(experiments.__file__).resolve().parent.parent
    if installed != CHECKOUT:  # its records would land in the installed checkout, not in this one
        sys.exit(
            f"pfllib_side_by_side.py: this script is {CHECKOUT}'s, the installed package is {installed}'s: run "
            f"{installed / 'bench' / Path(__file__).name}, or PYTHONPATH={CHECKOUT} python {__file__} ..."
        )
    main(commit_record=commit)
