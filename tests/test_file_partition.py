"""partition='file': a split written by save_partition_file reads back identically; bad files are refused with
one line naming what is wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.config import ConfigError, parse_run_config
from common.data.datasets import DataError
from common.data.federated import client_data, federated_split
from common.data.partition_file import read_partition_file, save_partition_file

DIGITS = 1797


def _file_cfg(path: Path, **extra: object):
    return parse_run_config({"dataset": "digits", "partition": "file", "partition-file": str(path), **extra})


def test_a_dirichlet_split_round_trips(tmp_path) -> None:
    split = federated_split(parse_run_config({"dataset": "digits", "partition": "dirichlet", "seed": 3}).data, 6)
    path = tmp_path / "split.npz"
    save_partition_file(path, split.train, split.test)
    again = federated_split(_file_cfg(path).data, 6)
    assert len(again.train) == len(again.test) == 6
    for a, b in zip((*split.train, *split.test), (*again.train, *again.test)):
        assert a.dtype == b.dtype == np.int64 and np.array_equal(a, b)
    client = client_data(_file_cfg(path).data, 2, 6)
    assert client.num_train == len(split.train[2]) and len(client.test_y) == len(split.test[2])


def test_a_run_with_fewer_clients_uses_the_first(tmp_path) -> None:
    train = [np.arange(10 * k, 10 * k + 8) for k in range(4)]
    test = [np.arange(10 * k + 8, 10 * k + 10) for k in range(4)]
    path = tmp_path / "four.npz"
    save_partition_file(path, train, test)
    got_train, got_test = read_partition_file(path, 2, DIGITS)
    assert [t.tolist() for t in got_train] == [t.tolist() for t in train[:2]]
    assert [t.tolist() for t in got_test] == [t.tolist() for t in test[:2]]


def test_the_file_is_written_to_exactly_its_path(tmp_path) -> None:
    path = tmp_path / "split.bin"
    save_partition_file(path, [np.array([0, 1])], [np.array([2])])
    assert path.is_file() and not (tmp_path / "split.bin.npz").exists()
    with pytest.raises(ValueError, match="one of each per client"):
        save_partition_file(path, [np.array([0])], [])


def _write(path: Path, **arrays: np.ndarray) -> Path:
    with path.open("wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]
    return path


GOOD = {"train_0": np.array([0, 1, 2]), "test_0": np.array([3]), "train_1": np.array([4, 5]), "test_1": np.array([6])}


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({**GOOD, "test_1": None}, r"client 1 has no 'test_1' array"),
        (
            {
                "train_0": GOOD["train_0"],
                "test_0": GOOD["test_0"],
                "train_2": GOOD["train_1"],
                "test_2": GOOD["test_1"],
            },
            r"client 1 has no 'train_1' array",
        ),
        ({**GOOD, "labels": np.array([1, 2])}, r"unexpected array 'labels'"),
        ({**GOOD, "train_1": np.array([4.0, 5.0])}, r"'train_1' has dtype float64; indices must be integers"),
        ({**GOOD, "train_1": np.array([[4, 5]])}, r"'train_1' has shape \(1, 2\); indices must be a 1-D array"),
        ({**GOOD, "test_0": np.array([DIGITS])}, rf"'test_0' holds index {DIGITS}, outside 0..{DIGITS - 1}"),
        ({**GOOD, "train_0": np.array([-1, 2])}, r"'train_0' holds index -1, outside"),
        ({**GOOD, "train_1": np.array([], dtype=np.int64)}, r"'train_1' is empty"),
        ({**GOOD, "test_1": np.array([], dtype=np.int64)}, r"'test_1' is empty"),
        ({**GOOD, "test_0": np.array([2, 3])}, r"client 0's train and test share 1 indices \(e.g. 2\)"),
        ({**GOOD, "train_1": np.array([4, "x"], dtype=object)}, r"'train_1' has dtype object; indices must be"),
        ({**GOOD, "train_1": np.array([True, False])}, r"'train_1' has dtype bool; indices must be integers"),
        ({**GOOD, "train_1": np.array([4, 5, 4])}, r"'train_1' repeats index 4; a client holds each of its samples"),
        ({**GOOD, "test_1": np.array([2])}, r"client 1 tests on index 2, which client 0 trains on"),
        ({**GOOD, "train_1": np.array([1, 5])}, r"clients 0 and 1 both train on index 1; a sample trains at most one"),
        ({}, r"holds no train_<k>/test_<k> arrays"),
    ],
)
def test_bad_files_are_refused_in_one_line(tmp_path, arrays: dict, message: str) -> None:
    path = _write(tmp_path / "bad.npz", **{k: v for k, v in arrays.items() if v is not None})
    with pytest.raises(DataError, match=rf"^partition-file {path}: .*{message}") as info:
        federated_split(_file_cfg(path).data, 2)
    assert "\n" not in str(info.value)


def test_more_clients_than_the_file_holds(tmp_path) -> None:
    path = _write(tmp_path / "two.npz", **GOOD)
    with pytest.raises(DataError, match=r"holds 2 clients, the run has 3: use at most 2 \(num-supernodes\)$"):
        federated_split(_file_cfg(path).data, 3)


def test_missing_and_unreadable_files(tmp_path) -> None:
    with pytest.raises(DataError, match=r"^partition-file .*absent\.npz: no such file$"):
        federated_split(_file_cfg(tmp_path / "absent.npz").data, 2)
    text = tmp_path / "text.npz"
    text.write_text("train_0,1,2\n")
    with pytest.raises(DataError, match=r"^partition-file .*text\.npz: not a readable \.npz archive \([^\n]*\)$"):
        federated_split(_file_cfg(text).data, 2)
    single = tmp_path / "single.npy"
    np.save(single, np.arange(4))
    with pytest.raises(DataError, match=r"a single \.npy array, not an \.npz archive"):
        federated_split(_file_cfg(single).data, 2)


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="run-config 'partition-file' = 'split.npz' must be an absolute path"):
        parse_run_config({"partition-file": "split.npz"})
    with pytest.raises(DataError, match="partition 'file' needs run-config 'partition-file'"):
        federated_split(parse_run_config({"dataset": "digits", "partition": "file"}).data, 2)


def test_max_samples_does_not_apply(tmp_path) -> None:
    path = _write(tmp_path / "good.npz", **GOOD)
    with pytest.raises(DataError, match="set max-samples to 0"):
        federated_split(_file_cfg(path, **{"max-samples": 500}).data, 2)


def test_a_failed_file_is_not_reread(tmp_path) -> None:
    """Failures are cached per process like every partition's: a fixed file needs a new process (or path)."""
    path = tmp_path / "late.npz"
    cfg = _file_cfg(path)
    with pytest.raises(DataError, match="no such file"):
        federated_split(cfg.data, 2)
    _write(path, **GOOD)
    with pytest.raises(DataError, match="no such file"):
        federated_split(cfg.data, 2)


def test_clients_may_share_test_samples_as_grouped_splits_do(tmp_path) -> None:
    """FedAMP's and PFLlib's grouped splits draw each client's test set from one pool: shared test indices are
    accepted, and each client tests on exactly its own list."""
    path = _write(tmp_path / "grouped.npz", **{**GOOD, "test_1": np.array([3, 6])})
    split = federated_split(_file_cfg(path).data, 2)
    assert [sorted(t.tolist()) for t in split.test] == [[3], [3, 6]]
    assert len(client_data(_file_cfg(path).data, 1, 2).test_y) == 2
