"""Data layer: the embedded default, real datasets from a local folder, clear errors, client views."""

from __future__ import annotations

import numpy as np
import pytest

from common.config import parse_run_config
from common.data.datasets import DataError, clear_dataset_cache, load_dataset, normalize
from common.data.federated import client_data, federated_split


def test_embedded_digits_needs_nothing() -> None:
    data = load_dataset("digits", "/nonexistent")
    assert data.x.shape == (1797, 1, 8, 8) and data.x.dtype == np.uint8
    assert data.x.max() == 16 and data.scale == 16.0
    assert np.bincount(data.y).min() >= 170


@pytest.mark.parametrize(
    ("name", "folder"),
    [("mnist", "MNIST/raw"), ("fashion-mnist", "FashionMNIST/raw"), ("cifar10", "cifar-10-batches-py")],
)
def test_missing_files_named_in_the_error(tmp_path, monkeypatch, name: str, folder: str) -> None:
    monkeypatch.setenv("PFL_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(DataError, match=str(tmp_path / folder)):
        load_dataset(name, str(tmp_path), False)


def test_mnist_from_local_folder(data_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PFL_CACHE_DIR", str(tmp_path))
    clear_dataset_cache()
    data = load_dataset("mnist", str(data_dir), False)
    assert data.x.shape == (70000, 1, 28, 28)
    # class counts of the MNIST training set (60,000) plus the test set (10,000)
    assert np.bincount(data.y)[:3].tolist() == [5923 + 980, 6742 + 1135, 5958 + 1032]
    x = normalize(data, data.x[:1000])
    assert abs(float(x.mean())) < 0.1 and 0.9 < float(x.std()) < 1.1
    clear_dataset_cache()


def _idx(shape: tuple[int, ...], values: np.ndarray, magic_type: int = 0x08) -> bytes:
    header = bytes((0, 0, magic_type, len(shape))) + np.asarray(shape, ">u4").tobytes()
    return header + values.astype(np.uint8).tobytes()


def test_idx_files_are_read_plain_or_gzipped_and_bad_ones_refused(tmp_path) -> None:
    import gzip

    from common.data.readers import read_idx

    images = np.arange(2 * 3 * 4).reshape(2, 3, 4) % 256
    (tmp_path / "x").write_bytes(_idx((2, 3, 4), images))
    (tmp_path / "x.gz").write_bytes(gzip.compress(_idx((2, 3, 4), images)))
    assert np.array_equal(read_idx(tmp_path / "x", 3), images) and read_idx(tmp_path / "x", 3).dtype == np.uint8
    assert np.array_equal(read_idx(tmp_path / "x.gz", 3), images)
    bad = {
        "truncated": _idx((2, 3, 4), images)[:-1],
        "too long": _idx((2, 3, 4), images) + b"\0",
        "int32 values": _idx((2, 3, 4), images, magic_type=0x0C),
        "header only": b"\0\0\x08",
    }
    for name, content in bad.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(DataError, match=str(tmp_path / name)):
            read_idx(tmp_path / name, 3)
    with pytest.raises(DataError, match="dimension"):
        read_idx(tmp_path / "x", 1)
    (tmp_path / "broken.gz").write_bytes(b"not gzip")
    with pytest.raises(DataError, match="cannot be read"):
        read_idx(tmp_path / "broken.gz", 3)


@pytest.mark.parametrize("folder", ["MNIST", "FashionMNIST"])
def test_mnist_like_arrays_are_torchvisions_without_importing_it(data_dir, tmp_path, folder: str) -> None:
    """The IDX files are read here (a deployment's ClientApp process saves ~4 CPU-s of torchvision imports per
    message); the arrays are those torchvision's own MNIST classes read, the process never imports torchvision."""
    import shutil
    import subprocess
    import sys

    from torchvision import datasets

    name = {"MNIST": "mnist", "FashionMNIST": "fashion-mnist"}[folder]
    script = (
        "import sys, numpy as np\n"
        "from common.data.datasets import load_dataset\n"
        f"d = load_dataset({name!r}, sys.argv[1], False)\n"
        "np.save(sys.argv[2], d.x); np.save(sys.argv[3], d.y)\n"
        "assert 'torchvision' not in sys.modules, 'torchvision imported'\n"
    )
    out_x, out_y = tmp_path / "x.npy", tmp_path / "y.npy"
    env = {"PFL_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(data_dir), str(out_x), str(out_y)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    (tmp_path / "tv" / folder / "raw").mkdir(parents=True)
    for gz in (data_dir / folder / "raw").glob("*.gz"):
        shutil.copyfile(gz, tmp_path / "tv" / folder / "raw" / gz.name)
    cls = getattr(datasets, folder)
    train, test = (cls(str(tmp_path / "tv"), train=t, download=True) for t in (True, False))
    assert np.array_equal(np.load(out_x)[:, 0], np.concatenate([train.data.numpy(), test.data.numpy()]))
    assert np.array_equal(np.load(out_y), np.concatenate([train.targets.numpy(), test.targets.numpy()]))


def test_cifar10_all_staged_batches_from_local_folder(data_dir) -> None:
    data = load_dataset("cifar10", str(data_dir), False)
    assert data.x.shape[1:] == (3, 32, 32) and len(data.y) == 60000  # batches 1-5 plus the test batch
    assert np.bincount(data.y).tolist() == [6000] * 10
    clear_dataset_cache()


def test_client_view_is_a_75_25_split_with_shift_draws() -> None:
    cfg = parse_run_config({"dataset": "digits", "partition": "iid", "seed": 1})
    split = federated_split(cfg.data, 5)
    assert sum(len(t) for t in split.train) + sum(len(t) for t in split.test) == 1797
    client = client_data(cfg.data, 2, 5)
    n = len(split.train[2]) + len(split.test[2])
    assert len(client.test_y) == round(0.25 * n) and client.num_train == n - len(client.test_y)
    assert client.train_x.dtype.is_floating_point and tuple(client.train_x.shape[1:]) == (1, 8, 8)
    assert len(client.shift_y) == len(client.test_y)
    assert set(client.shift_plan.draws.tolist()) <= set(split.pool.tolist())
    with pytest.raises(DataError, match="partition-id 5 is outside 0..4"):
        client_data(cfg.data, 5, 5)


def test_the_registry_is_what_the_run_config_offers_and_what_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A data set is one DATASET_SPECS entry plus its loader: the key's choices, `auto`'s model and the key's docs
    come from the registry, and loading and the preflight check go through the entry."""
    from common.config import AUTO_MODEL, DATASETS, RunConfig
    from common.data.datasets import DATASET_SPECS, DatasetSpec, check_dataset_files, clear_dataset_cache
    from common.hparams import describe

    assert DATASETS == tuple(DATASET_SPECS) and set(AUTO_MODEL) == set(DATASET_SPECS)
    dataset = next(info.hyper for info in describe(RunConfig) if info.key == "dataset")
    assert dataset.choices == DATASETS
    assert all(f"`{name}`: {spec.about}" in dataset.help for name, spec in DATASET_SPECS.items())

    digits = load_dataset("digits", "/nonexistent")
    calls: list[tuple[str, bool]] = []

    def load(data_dir, cache_dir, allow_download):  # type: ignore[no-untyped-def]
        calls.append((str(data_dir), allow_download))
        return digits

    def missing(data_dir, cache_dir, allow_download):  # type: ignore[no-untyped-def]
        return DataError(f"toy: no toy.npz in {data_dir}")

    monkeypatch.setitem(DATASET_SPECS, "toy", DatasetSpec("toy", "a toy", "mlp", load, missing))
    clear_dataset_cache()
    try:
        assert load_dataset("toy", "/data", True) is digits and calls == [("/data", True)]
        with pytest.raises(DataError, match="no toy.npz in /data"):
            check_dataset_files("toy", "/data")
    finally:
        clear_dataset_cache()
    with pytest.raises(DataError, match="unknown dataset 'nope'"):
        load_dataset("nope", "/data")


def test_the_split_cache_keys_on_the_split_section_only() -> None:
    """Settings the partition does not read (evaluation sizes, label faults) share one split; one it reads does not."""
    base = parse_run_config({"dataset": "digits", "max-samples": 600, "partition": "dirichlet"})
    other_eval = parse_run_config({**base.to_dict(), "stage-test-size": 50, "dirty-fraction": 0.5})
    other_alpha = parse_run_config({**base.to_dict(), "dirichlet-alpha": 5.0})
    assert base.data.split == other_eval.data.split and base.data != other_eval.data
    assert federated_split(base.data, 4) is federated_split(other_eval.data, 4)
    assert federated_split(base.data, 4) is not federated_split(other_alpha.data, 4)
    assert base.data.data_dir == str(base.resolved_data_dir)
