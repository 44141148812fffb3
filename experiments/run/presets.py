"""Named experiment presets: the run config and the simulated federation of `smoke`, `cpu` and `paper` runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.hparams import ConfigError

ENGINES = ("inprocess", "simulation")  # what runs a run: experiments/run/launchers.py builds each


@dataclass(frozen=True)
class Preset:
    """A run config (any run-config keys) and the federation it runs on."""

    name: str
    help: str
    run_config: dict[str, Any]
    clients: int
    cpus_per_client: int = 1
    gpus_per_client: float = 0.0  # used where a GPU is present


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "smoke",
            "seconds on a laptop: the embedded digits, 6 clients, 2 rounds (CI and tests)",
            {
                "dataset": "digits",
                "num-rounds": 2,
                "fraction-train": 0.5,
                "local-epochs": 1,
                "batch-size": 32,
                "lr": 0.05,
                "eval-every": 1,
                "shift-degrees": "0,0.5,1",
                "checkpoint-every": 1,
            },
            clients=6,
        ),
        Preset(
            "quickstart",
            "the README's quick start: the run-config defaults (the embedded digits, Dirichlet(0.3), 20 rounds of "
            "2 epochs, half the clients per round) on 10 clients",
            {},
            clients=10,
        ),
        Preset(
            "cpu",
            "each experiment under ~20 minutes on 2 cores: MNIST, 100 clients, 10% per round, 30 rounds of "
            "5 epochs (the papers' partitions and client counts, fewer rounds)",
            {
                "dataset": "mnist",
                "num-rounds": 30,
                "fraction-train": 0.1,
                "local-epochs": 5,
                "batch-size": 64,
                "lr": 0.05,
                "eval-every": 10,
            },
            clients=100,
        ),
        Preset(
            "paper",
            "the DM-PFL paper's setting (A.1.2-A.1.5): 100 clients, 10% per round, 300 rounds of 5 "
            "epochs, batch 64; for a GPU (4 clients per GPU) or a long run",
            {
                "dataset": "cifar10",
                "num-rounds": 300,
                "fraction-train": 0.1,
                "local-epochs": 5,
                "batch-size": 64,
                "lr": 0.05,
                "eval-every": 10,
                "device": "auto",
            },
            clients=100,
            gpus_per_client=0.25,
        ),
    )
}


def preset(name: str) -> Preset:
    """The named preset (ConfigError listing the names when there is none)."""
    if name not in PRESETS:
        raise ConfigError(f"preset {name!r} is not one of {', '.join(PRESETS)}")
    return PRESETS[name]


def run_config_text(config: dict[str, Any]) -> str:
    """A run config as `flwr run --run-config` takes it (strings quoted, booleans lower case)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        text = str(v)
        if "'" in text:
            raise ConfigError(f"run-config value {text!r} must not contain a single quote")
        return f"'{text}'"

    return " ".join(f"{key}={value(v)}" for key, v in config.items())
