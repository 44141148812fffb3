"""FEMNIST, UCI HAR and USPS from the data folder, the natural partition (by writer, by subject), their models,
and CIFAR-10 read with every batch present."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from common.config import AUTO_MODEL, parse_run_config
from common.data import datasets
from common.data.datasets import DataError, load_dataset, normalize
from common.data.federated import client_data, federated_split
from common.data.natural import natural_order, natural_partition
from common.data.readers import FEMNIST_FILE, HAR_FILES
from common.learning.models import build_model
from common.learning.train import TrainSettings, train

from .inprocess import InProcessFederation


def _staged(data_dir: Path, *files: str) -> str:
    missing = [f for f in files if not (data_dir / f).is_file()]
    if missing:
        pytest.skip(f"staged data missing: {', '.join(missing)}")
    return str(data_dir)


def _natural_cfg(dataset: str, data_dir: str, **extra: object):
    return parse_run_config({"dataset": dataset, "data-dir": data_dir, "partition": "natural", **extra})


def _assert_by_natural_id(ids: np.ndarray, train: tuple, test: tuple, kept: np.ndarray) -> None:
    """Every client holds all samples of exactly one kept id, in client order of `kept`; nothing lost or shared."""
    assert len(train) == len(test) == len(kept)
    seen = []
    for k, (tr, te) in enumerate(zip(train, test)):
        held = np.concatenate([tr, te])
        assert len(tr) and len(te)
        assert set(ids[held].tolist()) == {int(kept[k])}, "a client's samples come from one writer or subject"
        assert np.array_equal(np.sort(held), np.flatnonzero(ids == kept[k])), "every sample of its id, once"
        seen.append(held)
    everything = np.concatenate(seen)
    assert len(everything) == len(np.unique(everything)) == int(np.isin(ids, kept).sum())


# ----- the natural partition, on synthetic ids -----------------------------------------------------------------
def test_natural_partition_orders_by_size_and_drops_small_ids() -> None:
    ids = np.array([7] * 5 + [3] * 9 + [1] * 2 + [9] * 5 + [4] * 1)
    rng = np.random.default_rng(0)
    ids = ids[rng.permutation(len(ids))]
    kept, counts = natural_order(ids, min_samples=3)
    assert kept.tolist() == [3, 7, 9] and counts.tolist() == [9, 5, 5]  # ties: smaller id first
    parts = natural_partition(ids, 3, 3)
    for part, value in zip(parts, kept):
        assert np.array_equal(part, np.flatnonzero(ids == value))
    assert [len(p) for p in natural_partition(ids, 2, 3)] == [9, 5], "fewer clients take the largest ids"


def test_more_clients_than_natural_ids_is_one_line() -> None:
    ids = np.repeat(np.arange(4), [30, 25, 10, 3])
    with pytest.raises(
        DataError,
        match=r"^partition 'natural': toy has 2 writers with at least 20 samples "
        r"\(natural-min-samples; 2 of 4 dropped\), the run has 3 clients: use at "
        r"most 2 \(num-supernodes\)$",
    ):
        natural_partition(ids, 3, 20, "writer", "toy")


def test_natural_on_a_data_set_without_natural_ids_is_refused() -> None:
    cfg = parse_run_config({"dataset": "digits", "partition": "natural"})
    with pytest.raises(DataError, match="partition 'natural' needs a data set with natural clients"):
        federated_split(cfg.data, 4)


def test_natural_min_samples_is_validated() -> None:
    with pytest.raises(Exception, match="natural-min-samples"):
        parse_run_config({"natural-min-samples": 1})


@pytest.mark.parametrize(("name", "expected"), [("femnist", FEMNIST_FILE), ("har", HAR_FILES[0]), ("usps", "usps.bz2")])
def test_missing_files_are_named_in_one_line(tmp_path, name: str, expected: str) -> None:
    with pytest.raises(DataError, match=f"^{name}: expected .*{expected}") as info:
        load_dataset(name, str(tmp_path), False)
    assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)


# ----- real data ----------------------------------------------------------------------------------------------
def test_femnist_by_writer_nothing_lost(data_dir) -> None:
    root = _staged(data_dir, FEMNIST_FILE)
    data = load_dataset("femnist", root, False)
    assert data.x.shape == (18810, 1, 28, 28) and data.x.dtype == np.uint8 and data.num_classes == 62
    assert np.bincount(data.y, minlength=62).min() > 0 and data.natural_kind == "writer"
    assert np.median(data.x[:, 0, 0, 0]) == 0, "inverted: the background is 0, ink is high"
    x = normalize(data, data.x[:2000])
    assert abs(float(x.mean())) < 0.2 and 0.8 < float(x.std()) < 1.2
    assert data.natural_id is not None
    kept, _ = natural_order(data.natural_id, 20)
    assert len(kept) == 174  # of 190 writers, at the default natural-min-samples
    cfg = _natural_cfg("femnist", root)
    split = federated_split(cfg.data, len(kept))
    _assert_by_natural_id(data.natural_id, split.train, split.test, kept)
    test_share = sum(map(len, split.test)) / (sum(map(len, split.train)) + sum(map(len, split.test)))
    assert abs(test_share - 0.25) < 0.01
    with pytest.raises(DataError, match="femnist has 174 writers with at least 20 samples.*use at most 174"):
        federated_split(cfg.data, 175)
    fewer = federated_split(cfg.data, 10)
    _assert_by_natural_id(data.natural_id, fewer.train, fewer.test, kept[:10])


def test_har_by_subject_nothing_lost(data_dir) -> None:
    root = _staged(data_dir, *HAR_FILES)
    data = load_dataset("har", root, False)
    assert data.x.shape == (10299, 9, 128) and data.x.dtype == np.float32 and data.num_classes == 6
    assert np.bincount(data.y).tolist() == [1722, 1544, 1406, 1777, 1906, 1944]
    x = normalize(data, data.x)
    assert np.all(np.abs(x.mean(axis=(0, 2))) < 0.1) and np.all(np.abs(x.std(axis=(0, 2)) - 1) < 0.1)
    assert data.natural_id is not None and data.natural_kind == "subject"
    kept, counts = natural_order(data.natural_id, 20)
    assert len(kept) == 30 and counts.sum() == 10299 and counts[0] == 409
    cfg = _natural_cfg("har", root)
    split = federated_split(cfg.data, 30)
    _assert_by_natural_id(data.natural_id, split.train, split.test, kept)
    with pytest.raises(DataError, match="har has 30 subjects with at least 20 samples.*use at most 30"):
        federated_split(cfg.data, 31)
    raised = _natural_cfg("har", root, **{"natural-min-samples": 300})
    kept_raised, _ = natural_order(data.natural_id, 300)
    split = federated_split(raised.data, len(kept_raised))
    _assert_by_natural_id(data.natural_id, split.train, split.test, kept_raised)
    assert len(kept_raised) < 30


def test_usps_pools_train_and_test(data_dir) -> None:
    root = _staged(data_dir, "USPS/usps.bz2", "USPS/usps.t.bz2")
    data = load_dataset("usps", root, False)
    assert data.x.shape == (9298, 1, 16, 16) and data.x.dtype == np.uint8 and data.natural_id is None
    train = [1194, 1005, 731, 658, 652, 556, 664, 645, 542, 644]
    test = [359, 264, 198, 166, 200, 160, 170, 147, 166, 177]
    assert np.bincount(data.y).tolist() == [a + b for a, b in zip(train, test)]
    assert np.bincount(data.y[:7291]).tolist() == train, "the training rows come first"


def test_cifar10_reads_every_batch_present(data_dir, tmp_path, monkeypatch) -> None:
    """Batches 4 and 5 are read when present (stand-ins here: links to batch 1, accepted by a patched checksum)."""
    root = Path(_staged(data_dir, "cifar-10-batches-py/data_batch_1"))
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for name in os.listdir(root / "cifar-10-batches-py"):
        if name not in ("data_batch_4", "data_batch_5"):
            (folder / name).symlink_to(root / "cifar-10-batches-py" / name)
    for extra in ("data_batch_4", "data_batch_5"):
        (folder / extra).symlink_to(root / "cifar-10-batches-py" / "data_batch_1")
    sha = datasets.CIFAR_SUBSET_SHA256["data_batch_1"]
    monkeypatch.setattr(
        datasets, "CIFAR_SUBSET_SHA256", {**datasets.CIFAR_SUBSET_SHA256, "data_batch_4": sha, "data_batch_5": sha}
    )
    data = load_dataset("cifar10", str(tmp_path), False)
    datasets.clear_dataset_cache()
    assert len(data.y) == 60000
    assert np.array_equal(data.x[30000:40000], data.x[:10000]), "batches in order 1..5, then the test batch"


# ----- models fit the data ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("dataset", "shape", "classes"), [("femnist", (1, 28, 28), 62), ("har", (9, 128), 6), ("usps", (1, 16, 16), 10)]
)
def test_default_models_build(dataset: str, shape: tuple[int, ...], classes: int) -> None:
    for name in ("auto", AUTO_MODEL[dataset] + "-bn"):
        model = build_model(name, dataset, shape, classes, seed=0)
        assert model(torch.zeros(4, *shape)).shape == (4, classes)
    assert AUTO_MODEL["har"] == "dnn-har"
    assert sum(p.numel() for p in build_model("auto", "har", (9, 128), 6, 0).parameters()) == 328_838


@pytest.mark.parametrize(
    ("dataset", "files", "raw"),
    [
        ("femnist", (FEMNIST_FILE,), {"partition": "natural"}),
        ("har", HAR_FILES, {"partition": "natural", "batch-size": 10}),
        ("usps", ("USPS/usps.bz2", "USPS/usps.t.bz2"), {"partition": "dirichlet", "max-samples": 1500}),
    ],
)
def test_a_client_learns_and_a_round_runs(data_dir, dataset: str, files: tuple[str, ...], raw: dict) -> None:
    root = _staged(data_dir, *files)
    run_config = {"dataset": dataset, "data-dir": root, "fraction-train": 1.0, "local-epochs": 1, "lr": 0.05, **raw}
    cfg = parse_run_config(run_config)
    client = client_data(cfg.data, 0, 3)
    model = build_model("auto", dataset, client.input_shape, client.num_classes, seed=0)
    stats = train(
        model,
        client.train_x,
        client.train_y,
        TrainSettings(epochs=4, batch_size=cfg.batch_size, lr=0.05),
        torch.Generator().manual_seed(0),
    )
    assert stats.epoch_losses[-1] < stats.epoch_losses[0], stats.epoch_losses
    fed = InProcessFederation(run_config, 3)
    for rnd in (1, 2):
        replies = fed.train_round(rnd)
        assert len(replies) == 3
    accuracy = next(iter(fed.evaluate(2).values())).metric_records["metrics"]["acc-shift-0"]
    assert isinstance(accuracy, float) and 0.0 <= accuracy <= 1.0
