"""Typed run configuration: parse Flower's run config, validate it, explain bad values in one line."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATASETS = ("digits", "mnist", "fashion-mnist", "cifar10")
PARTITIONS = ("iid", "dirichlet", "pathological", "ls", "qs", "lsqs", "grouped")
MODELS = ("auto", "mlp", "cnn-mnist", "cnn-cifar")
OPTIMIZERS = ("sgd", "adam")
DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """A run-config key or value a user got wrong; the message is one line naming it."""


@dataclass(frozen=True)
class RunConfig:
    """Every run-config key, with its default (the same defaults as pyproject.toml)."""

    algorithm: str = "fedavg"
    dataset: str = "digits"
    data_dir: str = ""
    allow_download: bool = False
    partition: str = "dirichlet"
    dirichlet_alpha: float = 0.3
    test_fraction: float = 0.25
    max_samples: int = 0
    model: str = "auto"
    num_rounds: int = 20
    fraction_train: float = 0.5
    min_train_clients: int = 2
    fraction_evaluate: float = 1.0
    eval_every: int = 1
    local_epochs: int = 2
    batch_size: int = 32
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    lr_decay: float = 1.0
    proximal_mu: float = 0.05
    shift_degrees: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    seed: int = 0
    device: str = "auto"
    client_threads: int = 1
    round_timeout: float = 600.0
    drop_rate: float = 0.0
    straggler_rate: float = 0.0
    dirty_clients: float = 0.0
    dirty_fraction: float = 0.0
    stages: bool = False
    stage_test_size: int = 2000
    rho_eps: tuple[float, ...] = (0.9, 0.95)
    results_dir: str = ""
    run_name: str = ""
    checkpoint_every: int = 1
    resume: str = ""
    client_state_dir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def resolved_data_dir(self) -> Path:
        """Data folder: the config value, else $PFL_DATA_DIR, else ~/.cache/pflower/data."""
        raw = self.data_dir or os.environ.get("PFL_DATA_DIR", "")
        return Path(raw).expanduser() if raw else Path.home() / ".cache" / "pflower" / "data"

    @property
    def resolved_results_dir(self) -> Path:
        """Results folder: the config value, else $PFL_RESULTS_DIR, else ~/pflower-results."""
        raw = self.results_dir or os.environ.get("PFL_RESULTS_DIR", "")
        return (Path(raw).expanduser() if raw else Path.home() / "pflower-results").resolve()

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with run-config (dashed) key names, for config.json."""
        out = {_dashed(f.name): getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out["shift-degrees"] = list(self.shift_degrees)
        out["rho-eps"] = list(self.rho_eps)
        out.update(self.extra)
        return out


def _dashed(name: str) -> str:
    return name.replace("_", "-")


def _choice(key: str, value: Any, allowed: Iterable[str]) -> str:
    allowed = tuple(allowed)
    if not isinstance(value, str) or value.lower() not in allowed:
        raise ConfigError(f"run-config '{key}' = {value!r} is not valid; allowed values: {', '.join(allowed)}")
    return value.lower()


def _number(key: str, value: Any, kind: type, low: float | None = None, high: float | None = None,
            low_open: bool = False) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"run-config '{key}' = {value!r} must be a number ({kind.__name__})")
    if kind is int and float(value) != int(value):
        raise ConfigError(f"run-config '{key}' = {value!r} must be a whole number")
    value = kind(value)
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and value > high
    if too_low or too_high:
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        bracket = "(" if low_open else "["
        raise ConfigError(f"run-config '{key}' = {value!r} is out of range; allowed: {bracket}{lo}, {hi}]")
    return value


def _flag(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"run-config '{key}' = {value!r} must be true or false")


def parse_degrees(key: str, value: Any) -> tuple[float, ...]:
    """Parse '0,0.2,...' (or a list) into sorted unique numbers in [0, 1] (shift degrees, thresholds)."""
    items = value.split(",") if isinstance(value, str) else value
    try:
        degrees = sorted({round(float(item), 6) for item in items if str(item).strip() != ""})
    except (TypeError, ValueError):
        raise ConfigError(f"run-config '{key}' = {value!r} must be comma-separated numbers in [0, 1]") from None
    if not degrees or any(d < 0 or d > 1 for d in degrees):
        raise ConfigError(f"run-config '{key}' = {value!r} must be comma-separated numbers in [0, 1]")
    return tuple(degrees)


_PARSERS = {
    "algorithm": lambda k, v: v,  # checked against the strategy registry by the caller
    "dataset": lambda k, v: _choice(k, v, DATASETS),
    "data-dir": lambda k, v: str(v),
    "allow-download": _flag,
    "partition": lambda k, v: _choice(k, v, PARTITIONS),
    "dirichlet-alpha": lambda k, v: _number(k, v, float, 0.0, None, low_open=True),
    "test-fraction": lambda k, v: _number(k, v, float, 0.0, 0.9, low_open=True),
    "max-samples": lambda k, v: _number(k, v, int, 0, None),
    "model": lambda k, v: _choice(k, v, MODELS),
    "num-rounds": lambda k, v: _number(k, v, int, 1, 100_000),
    "fraction-train": lambda k, v: _number(k, v, float, 0.0, 1.0, low_open=True),
    "min-train-clients": lambda k, v: _number(k, v, int, 1, None),
    "fraction-evaluate": lambda k, v: _number(k, v, float, 0.0, 1.0),
    "eval-every": lambda k, v: _number(k, v, int, 0, None),
    "local-epochs": lambda k, v: _number(k, v, int, 0, 10_000),
    "batch-size": lambda k, v: _number(k, v, int, 1, None),
    "optimizer": lambda k, v: _choice(k, v, OPTIMIZERS),
    "lr": lambda k, v: _number(k, v, float, 0.0, 10.0, low_open=True),
    "momentum": lambda k, v: _number(k, v, float, 0.0, 0.999),
    "weight-decay": lambda k, v: _number(k, v, float, 0.0, 1.0),
    "lr-decay": lambda k, v: _number(k, v, float, 0.0, 1.0, low_open=True),
    "proximal-mu": lambda k, v: _number(k, v, float, 0.0, None),
    "shift-degrees": parse_degrees,
    "seed": lambda k, v: _number(k, v, int, 0, 2**31 - 1),
    "device": lambda k, v: _choice(k, v, DEVICES),
    "client-threads": lambda k, v: _number(k, v, int, 1, 256),
    "round-timeout": lambda k, v: _number(k, v, float, 0.0, None, low_open=True),
    "drop-rate": lambda k, v: _number(k, v, float, 0.0, 0.95),
    "straggler-rate": lambda k, v: _number(k, v, float, 0.0, 0.95),
    "dirty-clients": lambda k, v: _number(k, v, float, 0.0, 1.0),
    "dirty-fraction": lambda k, v: _number(k, v, float, 0.0, 1.0),
    "stages": _flag,
    "stage-test-size": lambda k, v: _number(k, v, int, 0, None),
    "rho-eps": parse_degrees,
    "results-dir": lambda k, v: str(v),
    "run-name": lambda k, v: str(v),
    "checkpoint-every": lambda k, v: _number(k, v, int, 0, None),
    "resume": lambda k, v: str(v),
    "client-state-dir": lambda k, v: str(v),
}


def parse_run_config(raw: Mapping[str, Any], algorithms: Iterable[str] | None = None,
                     extra_keys: Mapping[str, Any] | None = None) -> RunConfig:
    """Validate a Flower run config into a RunConfig; raise ConfigError naming the first bad key.

    `algorithms` are the registered names; `extra_keys` are algorithm-specific keys with defaults
    (kept, type-checked against the default's type, in `RunConfig.extra`).
    """
    extra_keys = dict(extra_keys or {})
    known = set(_PARSERS) | set(extra_keys)
    for key in raw:
        if key not in known:
            raise ConfigError(f"unknown run-config key '{key}'; known keys: {', '.join(sorted(known))}")
    values: dict[str, Any] = {}
    for key, parser in _PARSERS.items():
        if key in raw:
            values[key.replace("-", "_")] = parser(key, raw[key])
    if algorithms is not None and "algorithm" in values:
        values["algorithm"] = _choice("algorithm", values["algorithm"], sorted(algorithms))
    extra: dict[str, Any] = {}
    for key, default in extra_keys.items():
        value = raw.get(key, default)
        if isinstance(default, bool):
            value = _flag(key, value)
        elif isinstance(default, (int, float)):
            value = _number(key, value, type(default))
        extra[key] = value
    return RunConfig(**values, extra=extra)
