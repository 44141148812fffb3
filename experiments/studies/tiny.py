"""The tiny run that pins what the code does for a run config: the config with its size keys replaced, and a tiny
seeded stand-in of its data set (same sample shape, dtype, classes, domains and natural ids; random values), so
that the behaviour hash needs no data files and takes seconds."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.config import parse_run_config
from common.data.arrays import DatasetArrays

TINY_CLIENTS = 6  # at most this many simulated clients
TINY_SEED = 0
# Keys the tiny run sets whatever the run said (two configs that differ only in these share one behaviour hash).
REPLACED: dict[str, Any] = {
    "seed": TINY_SEED,
    "num-rounds": 4,
    "eval-every": 2,
    "local-epochs": 1,
    "max-samples": 0,
    "readjust-interval": 2,
    "fedamp-decay-every": 2,
    "checkpoint-every": 0,
    "device": "cpu",
    "client-threads": 1,
    "data-dir": "",
    "stage-test-size": 40,
    "domain-test-size": 20,
    "domain-share": 0.2,
    "domain-eval-size": 8,
    "corruption-eval-size": 8,
    "natural-min-samples": 20,
    "round-timeout": 600.0,
    "messages-in-flight": 64,
    "tensorboard": False,
    "mlflow-uri": "",
    "allow-download": False,
    # under `dp` the run's own noise and sample come from a secret (0: drawn anew each run); the tiny run fixes them,
    # or its messages, and so every DP record's hash, would differ each time
    "dp-noise-seed": 1,
}
DROPPED = ("results-dir", "run-name", "resume", "client-state-dir", "message-digests", "partition-file")
CAPPED = {"iterations": 1, "pretrain-epochs": 1, "holdout-finetune-epochs": 1}  # at most this value
# Secure aggregation needs 3 clients in a round: a run that samples 10% of its clients would sample fewer of the
# tiny run's 6, keep its model every round, and so pin nothing of its training.
SECAGG_LEAST_FRACTION = 0.5


@dataclass(frozen=True)
class StandIn:
    """What the tiny data set of a named data set has in common with it."""

    shape: tuple[int, ...]
    classes: int
    dtype: str = "uint8"
    scale: float = 255.0
    domain_names: tuple[str, ...] = ()
    natural_kind: str = ""


# Checked against the real data sets where they are staged (tests/test_studies.py).
STAND_INS: dict[str, StandIn] = {
    "digits": StandIn((1, 8, 8), 10, scale=16.0),
    "mnist": StandIn((1, 28, 28), 10),
    "fashion-mnist": StandIn((1, 28, 28), 10),
    "usps": StandIn((1, 16, 16), 10),
    "cifar10": StandIn((3, 32, 32), 10),
    "digit-domains": StandIn((3, 32, 32), 10, domain_names=("mnist", "usps", "mnist-m", "syn")),
    "femnist": StandIn((1, 28, 28), 62, natural_kind="writer"),
    "femnist-digits": StandIn((1, 28, 28), 10, natural_kind="writer"),
    "har": StandIn((9, 128), 6, dtype="float32", scale=1.0, natural_kind="subject"),
}
PER_CLASS = 40  # samples of each class (of each domain)
# FedAMP's exact split never scales its sizes down: TINY_CLIENTS clients of it take up to 514 samples of one class.
GROUPED_EXACT_PER_CLASS = 600
NATURAL_GROUPS = 8  # writers or subjects


def tiny_per_class(config: dict[str, Any]) -> int:
    """Samples of each class the stand-in of a tiny run's data set holds: PER_CLASS, more for `grouped-exact`."""
    return GROUPED_EXACT_PER_CLASS if config.get("partition") == "grouped-exact" else PER_CLASS


def tiny_dataset(name: str, per_class: int = PER_CLASS) -> DatasetArrays:
    """The seeded tiny stand-in of a data set (ConfigError-free: an unknown name is a KeyError the caller names)."""
    spec = STAND_INS[name]
    rng = np.random.Generator(np.random.PCG64(int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)))
    domains = max(1, len(spec.domain_names))
    n = spec.classes * per_class * domains
    if spec.dtype == "uint8":
        x = rng.integers(0, int(spec.scale) + 1, size=(n, *spec.shape), dtype=np.uint8)
    else:
        x = rng.standard_normal(size=(n, *spec.shape)).astype(np.float32)
    y = np.tile(np.arange(spec.classes, dtype=np.int64), per_class * domains)
    channels = spec.shape[0]
    domain = np.repeat(np.arange(domains, dtype=np.int64), n // domains) if spec.domain_names else None
    natural = (np.arange(n, dtype=np.int64) % NATURAL_GROUPS) if spec.natural_kind else None
    return DatasetArrays(
        name,
        x,
        y,
        spec.classes,
        (0.5,) * channels,
        (0.25,) * channels,
        spec.scale,
        domain=domain,
        domain_names=spec.domain_names,
        natural_id=natural,
        natural_kind=spec.natural_kind,
    )


def tiny_config(run_config: dict[str, Any], clients: int) -> tuple[dict[str, Any], int]:
    """The tiny run of a run config and its clients: every key the run's algorithm reads (defaults filled in, so a
    saved config.json and a sweep's partial config agree), REPLACED set, DROPPED removed, CAPPED capped, at most
    TINY_CLIENTS clients; ConfigError when today's code does not accept the config."""
    given = {k: v for k, v in run_config.items() if k not in DROPPED and k not in REPLACED}
    settings = parse_run_config(given).settings_dict()
    config = {k: _flat(v) for k, v in settings.items() if k not in DROPPED}
    for key, cap in CAPPED.items():
        if isinstance(config.get(key), int) and config[key] > cap:
            config[key] = cap
    config.update(REPLACED)
    if config.get("secagg", "none") != "none":
        config["fraction-train"] = max(float(config["fraction-train"]), SECAGG_LEAST_FRACTION)
    return config, max(1, min(clients, TINY_CLIENTS))


def _flat(value: Any) -> Any:
    """A parsed value as a run config holds it: lists as comma-separated text."""
    if isinstance(value, (list, tuple)):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return value


def tiny_key(run_config: dict[str, Any], clients: int) -> str:
    """The digest that names a tiny run: configs with one key share one behaviour hash."""
    config, tiny_clients = tiny_config(run_config, clients)
    text = json.dumps({"config": config, "clients": tiny_clients}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]
