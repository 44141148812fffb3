"""One hash per algorithm of everything its small runs send and receive: the digest of every training message, every
reply and every evaluation message and reply (run-config message-digests). Run it at two commits, or on both engines,
and compare the lines: a speed-up that claims to change nothing must leave every hash as it was.

    python bench/fingerprint.py [--data-dir ../shared/data] [--algorithms dmpfl,feddst,...] [--engine simulation]
    git stash; python bench/fingerprint.py > before.txt; git stash pop; python bench/fingerprint.py | diff before.txt -

Digits (embedded) for every algorithm; with real MNIST present also DM-PFL and FedDST on cnn-mnist with 10 clients,
20% a round (clients that never train are evaluated too).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import tempfile
from pathlib import Path

from common.algorithms import SPECS
from experiments.benchmarks.measure import message_digests
from experiments.run.launchers import ENGINES, make_engine

ROUNDS = 6


def fingerprint(engine_name: str, raw: dict, clients: int, workers: int) -> str:
    """Hash of the sorted message digests of a ROUNDS-round run (an evaluation every third round)."""
    with tempfile.TemporaryDirectory(prefix="fingerprint-") as tmp:
        engine = make_engine(engine_name, Path(__file__).resolve().parent.parent, workers)
        try:
            lines: list[str] = []
            config = {**raw, "results-dir": tmp, "run-name": "run", "message-digests": True}
            outcome = engine.run(config, clients, 3600, lines.append)
        finally:
            engine.close()
        if outcome.status != "finished:completed":
            raise SystemExit("run failed:\n" + "\n".join(lines[-30:]))
        rows = message_digests(Path(tmp) / "run")
    digest = hashlib.sha256()
    for row in rows:
        digest.update(row.encode())
    return digest.hexdigest()[:16]


def main() -> None:
    """Print `name hash` per case."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--algorithms", default=",".join(sorted(SPECS)))
    parser.add_argument("--engine", choices=ENGINES, default="inprocess")
    parser.add_argument("--workers", type=int, default=0, help="inprocess: worker processes (default: one per core)")
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    base = {
        "dataset": "digits",
        "num-rounds": ROUNDS,
        "eval-every": 3,
        "iterations": 1,
        "fraction-train": 0.5,
        "local-epochs": 1,
        "lr": 0.1,
        "readjust-ratio": 0.2,
        "seed": 3,
    }
    cases = [(algorithm, {**base, "algorithm": algorithm}, 6) for algorithm in args.algorithms.split(",")]
    cases.append(
        (
            "dmpfl-stages-momentum-wd",
            {**base, "algorithm": "dmpfl", "stages": True, "momentum": 0.9, "weight-decay": 0.01},
            6,
        )
    )
    if (Path(args.data_dir) / "MNIST").is_dir():
        mnist = {
            **base,
            "dataset": "mnist",
            "data-dir": str(Path(args.data_dir).resolve()),
            "model": "cnn-mnist",
            "max-samples": 3000,
            "fraction-train": 0.2,
            "shift-degrees": "0,0.5,1",
        }
        cases.append(("dmpfl-mnist", {**mnist, "algorithm": "dmpfl"}, 10))
        cases.append(("feddst-mnist-adam", {**mnist, "algorithm": "feddst", "optimizer": "adam", "lr": 0.001}, 10))
    else:
        print(f"# no MNIST under {args.data_dir}: the cnn-mnist cases are left out", flush=True)
    for name, raw, clients in cases:
        print(name, fingerprint(args.engine, raw, clients, args.workers), flush=True)


if __name__ == "__main__":
    main()
