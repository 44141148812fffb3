"""One hash per algorithm of everything its small in-process runs send and compute: every training message and reply
(arrays, metrics, configs) and every evaluation reply. Run it at two commits and compare the lines: a speed-up that
claims to change nothing must leave every hash as it was.

    python bench/fingerprint.py [--data-dir ../shared/data] [--algorithms dmpfl,feddst,...]
    git stash; python bench/fingerprint.py > before.txt; git stash pop; python bench/fingerprint.py | diff before.txt -

Digits (embedded) for every algorithm; with real MNIST present also DM-PFL and FedDST on cnn-mnist with 10 clients,
20% a round (clients that never train are evaluated too).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flwr.app import RecordDict  # noqa: E402

from common.config import parse_run_config  # noqa: E402
from tests.inprocess import InProcessFederation  # noqa: E402

DIGITS = ["dmpfl", "feddst", "fedavg", "fedprox", "dapperfl", "lg-fedavg", "fedper", "fedrep", "apfl", "fliu",
          "ditto", "fedamp", "heurfedamp", "fedfomo", "local", "fedavg-ft"]
ROUNDS = 6


def hash_record(digest: hashlib._Hash, content: RecordDict) -> None:
    """Feed a message's arrays (bytes), metrics and configs into `digest` in a fixed order."""
    for name in sorted(content.array_records):
        for key, array in sorted(content.array_records[name].items()):
            digest.update(f"{name}/{key}".encode())
            digest.update(array.numpy().tobytes())
    for name in sorted(content.metric_records):
        digest.update(json.dumps(dict(content.metric_records[name]), sort_keys=True).encode())
    for name in sorted(content.config_records):
        digest.update(json.dumps({k: str(v) for k, v in content.config_records[name].items()}, sort_keys=True).encode())


def fingerprint(raw: dict, clients: int) -> str:
    """Hash of ROUNDS training rounds (every message both ways) and an evaluation every third round."""
    fed = InProcessFederation(parse_run_config(raw), clients)
    digest = hashlib.sha256()
    for rnd in range(1, ROUNDS + 1):
        replies = fed.train_round(rnd)
        for pid in sorted(fed.sent[rnd]):
            hash_record(digest, fed.sent[rnd][pid])
        for pid in sorted(replies):
            hash_record(digest, replies[pid])
        if rnd % 3 == 0:
            evaluated = fed.evaluate(rnd)
            for pid in sorted(evaluated):
                hash_record(digest, evaluated[pid])
    return digest.hexdigest()[:16]


def main() -> None:
    """Print `name hash` per case."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--algorithms", default=",".join(DIGITS))
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    base = {"dataset": "digits", "num-rounds": ROUNDS, "iterations": 1, "fraction-train": 0.5, "local-epochs": 1,
            "lr": 0.1, "readjust-ratio": 0.2, "seed": 3}
    cases = [(algorithm, {**base, "algorithm": algorithm}, 6) for algorithm in args.algorithms.split(",")]
    cases.append(("dmpfl-stages-momentum-wd", {**base, "algorithm": "dmpfl", "stages": True, "momentum": 0.9,
                                               "weight-decay": 0.01}, 6))
    if (Path(args.data_dir) / "MNIST").is_dir():
        mnist = {**base, "dataset": "mnist", "data-dir": args.data_dir, "model": "cnn-mnist", "max-samples": 3000,
                 "fraction-train": 0.2, "shift-degrees": "0,0.5,1"}
        cases.append(("dmpfl-mnist", {**mnist, "algorithm": "dmpfl"}, 10))
        cases.append(("feddst-mnist-adam", {**mnist, "algorithm": "feddst", "optimizer": "adam", "lr": 0.001}, 10))
    else:
        print(f"# no MNIST under {args.data_dir}: the cnn-mnist cases are left out", flush=True)
    for name, raw, clients in cases:
        print(name, fingerprint(raw, clients), flush=True)


if __name__ == "__main__":
    main()
