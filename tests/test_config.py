"""Run-config validation: pyproject defaults parse; each bad value gives one line naming key and allowed values."""

from __future__ import annotations

import dataclasses
import importlib.util
import tomllib
from types import ModuleType

import pytest

from common.algorithms import SPECS, DMPFLParams, FLIUParams, NoParams
from common.config import ConfigError, RunConfig, known_keys, parse_run_config

from .conftest import REPO


def _load_config_docs() -> ModuleType:
    """docs/config_docs.py, a script of the repository (not of the package), loaded from its file."""
    spec = importlib.util.spec_from_file_location("config_docs", REPO / "docs" / "config_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


config_docs = _load_config_docs()


def _defaults() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def test_pyproject_defaults_equal_declared_defaults() -> None:
    assert set(_defaults()) == set(known_keys())
    assert parse_run_config(_defaults()).to_dict() == parse_run_config({}).to_dict()
    assert parse_run_config({}).to_dict()["shift-degrees"] == list(RunConfig().shift_degrees)


def test_pyproject_and_key_tables_are_generated_from_the_specs() -> None:
    assert config_docs.main(["--check"]) == 0, "run `python docs/config_docs.py`"


@pytest.mark.parametrize(
    ("name", "old", "new"),
    [
        ("pyproject.toml", "sparsity = 0.5", "sparsity = 0.6"),  # a default that drifted
        ("pyproject.toml", "fomo-models = 5\n", ""),  # a key missing
        ("docs/configuration.md", "| `heurfedamp-tau` | `0.95` |", "| `heurfedamp-tau` | `0.9` |"),
    ],
)
def test_a_drifted_pyproject_or_key_table_fails_the_check(tmp_path, name: str, old: str, new: str) -> None:
    (tmp_path / "docs").mkdir()
    for file in ("pyproject.toml", "docs/configuration.md"):
        (tmp_path / file).write_text((REPO / file).read_text())
    text = (tmp_path / name).read_text()
    assert old.replace("\\n", "\n") in text
    (tmp_path / name).write_text(text.replace(old, new, 1))
    assert config_docs.main(["--check", "--repo", str(tmp_path)]) == 1
    assert config_docs.main(["--repo", str(tmp_path)]) == 0, "rewriting repairs it"
    assert config_docs.main(["--check", "--repo", str(tmp_path)]) == 0


def test_algorithm_keys_land_in_the_algorithms_dataclass() -> None:
    cfg = parse_run_config({"algorithm": "dmpfl", "sparsity": 0.7, "iterations": 2, "fliu-gamma": 0.5})
    params = cfg.params_as(DMPFLParams)
    assert (params.sparsity, params.iterations, params.min_vote_fraction) == (0.7, 2, 0.3)
    assert cfg.to_dict()["fliu-gamma"] == 0.5, "other algorithms' keys are validated and recorded too"
    with pytest.raises(TypeError, match="DMPFLParams"):
        cfg.params_as(FLIUParams)
    assert isinstance(parse_run_config({"algorithm": "fedavg"}).params, NoParams)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("algorithm", "fedsgd", f"'algorithm' = 'fedsgd' is not valid; allowed values: {', '.join(sorted(SPECS))}"),
        (
            "partition",
            "random",
            "'partition' = 'random' is not valid; allowed values: iid, dirichlet, pathological, ls, qs, lsqs, grouped",
        ),
        ("dataset", "svhn", "allowed values: digits, mnist, fashion-mnist, cifar10"),
        ("fraction-train", 1.5, "'fraction-train' = 1.5 is out of range; allowed: (0.0, 1.0]"),
        ("fraction-train", 0.0, "out of range"),
        ("num-rounds", 2.5, "'num-rounds' = 2.5 must be a whole number"),
        ("lr", "fast", "'lr' = 'fast' must be a number"),
        ("allow-download", "yes", "must be true or false"),
        ("shift-degrees", "0,1.5", "'shift-degrees' = '0,1.5' must be comma-separated numbers in [0, 1]"),
        ("shift-degrees", "a,b", "must be comma-separated numbers"),
        ("device", "tpu", "allowed values: auto, cpu, cuda"),
        ("sparsity", 1.0, "'sparsity' = 1.0 is out of range; allowed: [0.0, 1.0)"),
        ("readjust-interval", 0, "'readjust-interval' = 0 is out of range; allowed: [1, inf]"),
        ("fliu-gamma", 1.5, "'fliu-gamma' = 1.5 must be -1 (adaptive, Eq. 4) or lie in [0, 1]"),
        ("fliu-weighting", "median", "allowed values: uniform, samples"),
        ("fomo-val-fraction", 1.0, "'fomo-val-fraction' = 1.0 is out of range; allowed: (0.0, 1.0)"),
        ("fedamp-lambda", 0.0, "'fedamp-lambda' = 0.0 is out of range"),
        ("iterations", "three", "'iterations' = 'three' must be a number (int)"),
    ],
)
def test_bad_values_name_key_and_allowed_values(key: str, value, message: str) -> None:
    raw = {**_defaults(), key: value}
    with pytest.raises(ConfigError) as info:
        parse_run_config(raw)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown run-config key 'num-round'"):
        parse_run_config({"num-round": 3})


def test_shift_degrees_parsed_sorted_unique() -> None:
    assert parse_run_config({"shift-degrees": "1, 0.5,0,0.5"}).shift_degrees == (0.0, 0.5, 1.0)


def test_paths_default_and_override(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("PFL_DATA_DIR", raising=False)
    monkeypatch.setenv("PFL_RESULTS_DIR", str(tmp_path))
    cfg = parse_run_config({})
    assert cfg.resolved_results_dir == tmp_path.resolve()
    assert cfg.resolved_data_dir.name == "data"
    assert parse_run_config({"data-dir": str(tmp_path)}).resolved_data_dir == tmp_path


def test_the_sections_are_views_of_the_flat_keys() -> None:
    """Each section holds the values of the keys it groups, parsed from the same flat run config."""
    cfg = parse_run_config(
        {
            "lr": 0.2,
            "lr-decay": 0.5,
            "local-epochs": 3,
            "shift-degrees": "0,1",
            "partition": "domains",
            "dataset": "digit-domains",
            "drop-rate": 0.25,
            "run-name": "x",
            "checkpoint-every": 2,
        }
    )
    assert cfg.training.local_epochs == 3 and cfg.training.lr_after(2) == pytest.approx(0.05)
    assert cfg.evaluation.shift_degrees == (0.0, 1.0) and cfg.evaluation.domains
    assert not parse_run_config({}).evaluation.domains
    assert cfg.faults.drop_rate == 0.25 and cfg.faults.straggler_rate == cfg.straggler_rate
    assert cfg.output.run_name == "x" and cfg.output.checkpoint_every == 2
    assert cfg.output.results_dir == cfg.resolved_results_dir
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.training.lr = 1.0  # type: ignore[misc]
