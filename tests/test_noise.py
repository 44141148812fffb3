"""Dirty labels: exactly the configured clients and fraction of training labels are flipped to another class."""

from __future__ import annotations

import numpy as np
import pytest

from common.config import ConfigError, parse_run_config
from common.data.federated import client_data, federated_split
from common.data.noise import flip_labels, seeded_client_ids


def test_flip_labels_changes_exactly_the_fraction_to_other_classes() -> None:
    labels = np.repeat(np.arange(10), 20)
    flipped = flip_labels(labels, 0.4, 10, seed=3)
    changed = flipped != labels
    assert changed.sum() == 80
    assert flipped.min() >= 0 and flipped.max() <= 9
    np.testing.assert_array_equal(flipped, flip_labels(labels, 0.4, 10, seed=3))
    np.testing.assert_array_equal(labels, np.repeat(np.arange(10), 20)), "input untouched"


def test_seeded_client_ids_count_and_seed() -> None:
    ids = seeded_client_ids(5, 0.4, seed=1)
    assert len(ids) == 2 and ids <= set(range(5)) and ids == seeded_client_ids(5, 0.4, seed=1)
    assert seeded_client_ids(5, 0.0, seed=1) == frozenset()


def test_only_dirty_clients_train_on_flipped_labels_and_tests_stay_clean() -> None:
    cfg = parse_run_config({"dataset": "digits", "dirty-clients": 0.4, "dirty-fraction": 0.5})
    clean_cfg = parse_run_config({"dataset": "digits"})
    dirty = [pid for pid in range(5) if client_data(cfg.data, pid, 5).dirty]
    assert len(dirty) == 2
    for pid in range(5):
        noisy, clean = client_data(cfg.data, pid, 5), client_data(clean_cfg.data, pid, 5)
        changed = int((noisy.train_y != clean.train_y).sum())
        assert changed == (round(0.5 * clean.num_train) if pid in dirty else 0)
        assert bool((noisy.test_y == clean.test_y).all())
    assert federated_split(cfg.data, 5).train[0].size == federated_split(clean_cfg.data, 5).train[0].size


@pytest.mark.parametrize(
    "key, value",
    [
        ("drop-rate", 0.99),
        ("dirty-fraction", 1.5),
        ("dirty-clients", -0.1),
        ("rho-eps", "0.9,2"),
        ("stage-test-size", -1),
        ("stages", "maybe"),
    ],
)
def test_fault_and_stage_keys_are_validated(key: str, value) -> None:
    with pytest.raises(ConfigError, match=f"'{key}'"):
        parse_run_config({key: value})


def test_max_samples_partitions_a_seeded_subset_without_loss_or_duplicates() -> None:
    cfg = parse_run_config({"dataset": "digits", "max-samples": 600, "partition": "iid"})
    split = federated_split(cfg.data, 4)
    used = np.concatenate(split.train + split.test)
    assert len(used) == 600 and len(np.unique(used)) == 600
    again = federated_split(parse_run_config({"dataset": "digits", "max-samples": 600, "partition": "iid"}).data, 4)
    np.testing.assert_array_equal(np.concatenate(again.train), np.concatenate(split.train))
