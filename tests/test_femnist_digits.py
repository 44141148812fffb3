"""`femnist-digits`: the staged FEMNIST file's digit samples (labels 0-9, 10 classes), writers kept, partitioned by
writer like `femnist`; accepted wherever a data set is named (run config, auto model, preflight, export)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from common.config import AUTO_MODEL, DATASETS, parse_run_config
from common.data.datasets import DataError, check_dataset_files, load_dataset
from common.data.federated import client_data, federated_split
from common.data.natural import natural_order
from common.data.readers import FEMNIST_FILE, FEMNIST_NORM
from common.hparams import ConfigError
from common.learning.models import build_model
from experiments.run.exports import read_export, write_export
from experiments.run.preflight import check_runs
from experiments.run.presets import preset
from experiments.run.runs import plan


@pytest.fixture(scope="module")
def femnist_root(data_dir: Path) -> str:
    """The real-data folder holding the staged FEMNIST file (the test is skipped, saying why, without it)."""
    if not (data_dir / FEMNIST_FILE).is_file():
        pytest.skip(f"staged data missing: {data_dir / FEMNIST_FILE}")
    return str(data_dir)


@pytest.fixture(scope="module")
def raw_file(femnist_root: str) -> dict[str, np.ndarray]:
    """The file's arrays as stored."""
    with np.load(Path(femnist_root) / FEMNIST_FILE, allow_pickle=False) as archive:
        return {key: archive[key] for key in ("x", "y", "writer")}


# ----- without data ---------------------------------------------------------------------------------------------
def test_the_run_config_accepts_it_and_auto_picks_femnists_model() -> None:
    assert "femnist-digits" in DATASETS
    assert AUTO_MODEL["femnist-digits"] == AUTO_MODEL["femnist"] == "cnn-mnist"
    assert parse_run_config({"dataset": "femnist-digits", "partition": "natural"}).dataset == "femnist-digits"
    assert parse_run_config({"dataset": "femnist-digits", "algorithm": "fedbn"}).model == "cnn-mnist-bn"
    with pytest.raises(ConfigError, match="femnist-digits"):
        parse_run_config({"dataset": "femnist-digit"})  # the error lists the allowed names


def test_missing_file_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"^femnist-digits: expected .*{FEMNIST_FILE}") as info:
        load_dataset("femnist-digits", str(tmp_path), False)
    assert "\n" not in str(info.value)
    with pytest.raises(DataError, match=f"^femnist-digits: expected {tmp_path / FEMNIST_FILE}"):
        check_dataset_files("femnist-digits", str(tmp_path))


def test_preflight_checks_its_file(tmp_path: Path) -> None:
    (spec,) = plan("digits-run", preset("smoke"), {"dataset": "femnist-digits", "data-dir": str(tmp_path)}, [0])
    with pytest.raises(ConfigError, match="^experiment digits-run: femnist-digits: expected .*femnist_leaf"):
        check_runs([spec], tmp_path / "out")


# ----- the staged file --------------------------------------------------------------------------------------------
def test_exactly_the_files_digit_samples(femnist_root: str, raw_file: dict[str, np.ndarray]) -> None:
    data = load_dataset("femnist-digits", femnist_root, False)
    digits = raw_file["y"] < 10
    assert data.name == "femnist-digits" and data.num_classes == 10
    assert len(data.y) == int(digits.sum()) < len(raw_file["y"])
    assert data.y.min() == 0 and data.y.max() == 9
    assert np.array_equal(data.y, raw_file["y"][digits]), "labels as stored, in the file's order"
    assert data.natural_kind == "writer" and data.natural_id is not None
    assert np.array_equal(data.natural_id, raw_file["writer"][digits]), "every sample keeps its writer"
    assert np.array_equal(data.x[:, 0], 255 - raw_file["x"][digits]), "inverted as femnist: ink high"
    full = load_dataset("femnist", femnist_root, False)
    assert (data.mean, data.std, data.scale) == (full.mean, full.std, full.scale) == (*FEMNIST_NORM, 255.0)
    assert data.input_shape == full.input_shape == (1, 28, 28)


def test_natural_partition_gives_one_writer_per_client(femnist_root: str) -> None:
    data = load_dataset("femnist-digits", femnist_root, False)
    assert data.natural_id is not None
    kept, counts = natural_order(data.natural_id, 20)
    assert 0 < len(kept) < len(np.unique(data.natural_id)), "writers with under 20 digits are dropped"
    cfg = parse_run_config({"dataset": "femnist-digits", "data-dir": femnist_root, "partition": "natural"})
    split = federated_split(cfg.data, len(kept))
    for writer, count, train, test in zip(kept, counts, split.train, split.test):
        held = np.concatenate([train, test])
        assert set(data.natural_id[held].tolist()) == {int(writer)}, "a client's samples come from one writer"
        assert np.array_equal(np.sort(held), np.flatnonzero(data.natural_id == writer)), "all its digits, once"
        assert len(held) == count and len(train) and len(test)
    with pytest.raises(DataError, match=f"femnist-digits has {len(kept)} writers with at least 20 samples"):
        federated_split(cfg.data, len(kept) + 1)


def test_a_client_and_its_auto_model_have_ten_classes(femnist_root: str) -> None:
    cfg = parse_run_config({"dataset": "femnist-digits", "data-dir": femnist_root, "partition": "natural"})
    client = client_data(cfg.data, 0, 3)
    assert client.num_classes == 10 and set(client.train_y.tolist()) <= set(range(10))
    model = build_model(cfg.model, cfg.dataset, client.input_shape, client.num_classes, seed=0)
    assert model(client.train_x[:4]).shape == (4, 10)


def test_an_export_serves_it_under_its_name(femnist_root: str, tmp_path: Path) -> None:
    data = load_dataset("femnist-digits", femnist_root, False)
    write_export(data, range(50), tmp_path / "digits.npz")
    served, held = read_export(tmp_path / "digits.npz")
    assert served.name == "femnist-digits" and served.num_classes == 10 and held == set(range(50))
    assert served.natural_id is not None and np.array_equal(served.natural_id, data.natural_id)
    assert torch.equal(torch.from_numpy(served.x[:50]), torch.from_numpy(data.x[:50]))
