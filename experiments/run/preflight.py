"""Checks of every run a CLI command is about to start, before the first one starts: the data set's files, the
partition file, the results folder. A problem is one line (ConfigError, exit 2) in a second, not an error found by a
SuperLink and a simulation started for it, once per seed."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from common.config import parse_run_config
from common.data.arrays import DataError
from common.data.datasets import check_dataset_files
from common.hparams import ConfigError
from common.methods.privacy import ACCOUNTANT_HINT, accountant_installed
from experiments.run.exports import probe_export
from experiments.run.runs import RunSpec
from server_app.results.tracking import check_installed


def _writable_folder(folder: Path) -> None:
    """ConfigError unless `folder` is a writable folder or can be made one (its nearest existing parent is)."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"results folder {folder} is a file, not a folder: pass --out with a folder")
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable" if existing == folder else f"cannot be made: {existing} is not writable"
        raise ConfigError(f"results folder {folder} {what}: pass --out with a folder you may write")


def _check_data_env() -> None:
    """ConfigError when $PFL_DATA_DIR is relative (the runs would resolve it in another folder)."""
    env = os.environ.get("PFL_DATA_DIR", "")
    if env and not Path(env).expanduser().is_absolute():
        raise ConfigError(
            f"$PFL_DATA_DIR={env!r} is a relative path: set it to an absolute one, e.g. {Path.cwd() / env}"
        )


def check_engine_installed(engine: str) -> None:
    """ConfigError naming the extra to install when the engine's packages are missing (the simulation needs Ray,
    which a base or server install lacks)."""
    if engine == "simulation" and importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "--engine simulation needs Flower's simulation (Ray): pip install -e '.[simulation]' (or '.[study]'), "
            "or run on the in-process engine (--engine inprocess)"
        )


def check_runs(specs: list[RunSpec], out_dir: Path, data_export: Path | None = None) -> None:
    """ConfigError naming the first run whose data set files, partition file or results folder are missing
    (`data_export`: the runs read that file instead of the data sets)."""
    _writable_folder(out_dir)
    exported = None
    if data_export is not None:
        if not data_export.is_file():
            raise ConfigError(f"--data-export {data_export}: no such file (write one with `pflower export`)")
        try:
            exported = probe_export(data_export)
        except DataError as exc:
            raise ConfigError(str(exc)) from None
    checked: set[tuple[str, str, bool]] = set()
    for spec in specs:
        cfg = parse_run_config(spec.run_config)
        try:
            check_installed(cfg.to_dict())
            if cfg.dp != "none" and not accountant_installed():
                raise ConfigError(f"run-config 'dp' needs the privacy accountant: {ACCOUNTANT_HINT}")
            if exported is not None and cfg.dataset != exported:
                raise ConfigError(f"the data export {data_export} holds {exported}, the run reads {cfg.dataset}")
            if data_export is None:
                if not cfg.data_dir:
                    _check_data_env()
                key = (cfg.dataset, str(cfg.resolved_data_dir), cfg.allow_download)
                if key not in checked:
                    check_dataset_files(cfg.dataset, str(cfg.resolved_data_dir), cfg.allow_download)
                    checked.add(key)
            if cfg.partition == "file" and not Path(cfg.partition_file).expanduser().is_file():
                what = f"{cfg.partition_file!r}: no such file" if cfg.partition_file else "is not set"
                raise ConfigError(f"partition 'file': run-config 'partition-file' {what}")
            if cfg.partition == "file" and exported is None:
                from common.data.federated import federated_split

                federated_split(cfg.data, spec.clients)  # its clients, index ranges and overlaps, not at the handshake
        except (DataError, ConfigError) as exc:
            raise ConfigError(f"experiment {spec.experiment}: {exc}") from None
