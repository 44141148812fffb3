"""Run-config validation: pyproject defaults parse; each bad value gives one line naming key and allowed values."""

from __future__ import annotations

import tomllib

import pytest

from common.config import ConfigError, RunConfig, parse_run_config
from common.algorithms import SPECS

from .conftest import REPO


def _defaults() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def test_pyproject_defaults_equal_dataclass_defaults() -> None:
    cfg = parse_run_config(_defaults())
    reference = RunConfig()
    for key, value in reference.to_dict().items():
        assert cfg.to_dict()[key] == value, key


@pytest.mark.parametrize(("key", "value", "message"), [
    ("algorithm", "fedsgd", "'algorithm' = 'fedsgd' is not valid; allowed values: dmpfl, fedamp, fedavg, fedavg-ft, feddst, fedfomo, fedprox, fliu, heurfedamp, local"),
    ("partition", "random", "'partition' = 'random' is not valid; allowed values: iid, dirichlet, pathological, ls, qs, lsqs, grouped"),
    ("dataset", "svhn", "allowed values: digits, mnist, fashion-mnist, cifar10"),
    ("fraction-train", 1.5, "'fraction-train' = 1.5 is out of range; allowed: (0.0, 1.0]"),
    ("fraction-train", 0.0, "out of range"),
    ("num-rounds", 2.5, "'num-rounds' = 2.5 must be a whole number"),
    ("lr", "fast", "'lr' = 'fast' must be a number"),
    ("allow-download", "yes", "must be true or false"),
    ("shift-degrees", "0,1.5", "'shift-degrees' = '0,1.5' must be comma-separated numbers in [0, 1]"),
    ("shift-degrees", "a,b", "must be comma-separated numbers"),
    ("device", "tpu", "allowed values: auto, cpu, cuda"),
])
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
