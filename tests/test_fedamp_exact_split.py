"""`partition='grouped-exact'`: FedAMP's grouped split as its paper states it (appendix C.1, MNIST): per client of
group g, 500/400/300/200/100 training samples plus 100 test samples, 80% of each set from the group's two classes,
all sets disjoint, seeded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.config import parse_run_config
from common.data.datasets import DataError
from common.data.federated import federated_split
from common.data.partition import grouped_exact

PAPER_TRAIN = (500, 400, 300, 200, 100)
PAPER_TEST = 100
CLIENTS = 100  # the paper's 5 groups of 20
# The dominant share is exact by construction (80% of 500..100 samples are whole numbers); the tolerance only
# allows for rounding should the sizes change.
SHARE_TOLERANCE = 0.01
# Uneven classes (about 6,200 to 9,800 samples): the counts must not rely on balanced data.
LABELS = np.random.default_rng(5).choice(10, size=80_000, p=np.linspace(5, 8, 10) / np.linspace(5, 8, 10).sum())


def _group(client: int) -> int:
    return client * 5 // CLIENTS


def _assert_paper_split(labels: np.ndarray, train: list[np.ndarray] | tuple, test: list[np.ndarray] | tuple) -> None:
    """Exact sizes, disjoint sets, 80% of both sets on the group's two classes, the rest even over the others."""
    assert len(train) == len(test) == CLIENTS
    everything = np.concatenate([*train, *test])
    assert len(np.unique(everything)) == len(everything), "no sample in two sets (train or test, any clients)"
    for k, (tr, te) in enumerate(zip(train, test)):
        g = _group(k)
        assert (len(tr), len(te)) == (PAPER_TRAIN[g], PAPER_TEST), f"client {k}"
        dominant = (2 * g, 2 * g + 1)
        for part in (tr, te):
            counts = np.bincount(labels[part], minlength=10)
            share = counts[list(dominant)].sum() / len(part)
            assert abs(share - 0.8) <= SHARE_TOLERANCE, (k, share)
            assert abs(int(counts[dominant[0]]) - int(counts[dominant[1]])) <= 1, "the two classes evenly"
            others = np.delete(counts, dominant)
            assert others.max() - others.min() <= 1 and others.min() > 0, "the other 20% evenly over 8 classes"


def test_exact_counts_disjoint_and_the_80_percent_mix_on_synthetic_labels() -> None:
    train, test = grouped_exact(LABELS, CLIENTS, seed=3)
    _assert_paper_split(LABELS, train, test)
    sizes = [len(p) for p in train]
    assert sizes[:20] == [500] * 20 and sizes[-20:] == [100] * 20
    assert sum(sizes) == 30_000 and sum(map(len, test)) == 10_000
    assert all(p.dtype == np.int64 for p in [*train, *test])


def test_seeded() -> None:
    first, again, other = (grouped_exact(LABELS, CLIENTS, seed=s) for s in (3, 3, 4))
    for a, b in zip([*first[0], *first[1]], [*again[0], *again[1]]):
        assert np.array_equal(a, b)
    assert not np.array_equal(first[0][0], other[0][0]) and not np.array_equal(first[1][0], other[1][0])


def test_fewer_clients_keep_the_groups_and_sizes() -> None:
    train, test = grouped_exact(LABELS, 10, seed=0)
    assert [len(p) for p in train] == [500, 500, 400, 400, 300, 300, 200, 200, 100, 100]
    assert {len(p) for p in test} == {PAPER_TEST}


def test_too_few_samples_is_one_line_never_scaled() -> None:
    with pytest.raises(DataError, match=r"^grouped-exact partition: 100 clients need \d+ samples of class \d+, "):
        grouped_exact(LABELS[:20_000], CLIENTS, seed=0)
    with pytest.raises(DataError, match="5 groups need between 1 and 3 clients"):
        grouped_exact(LABELS, 3, seed=0)
    digits = parse_run_config({"dataset": "digits", "partition": "grouped-exact"})
    with pytest.raises(DataError, match="partition 'grouped'"):
        federated_split(digits.data, 10)


def test_real_mnist_through_the_run_config(data_dir: Path) -> None:
    if not (data_dir / "MNIST" / "raw").is_dir():
        pytest.skip(f"MNIST missing under {data_dir}")
    from common.data.datasets import load_dataset

    cfg = parse_run_config({"dataset": "mnist", "data-dir": str(data_dir), "partition": "grouped-exact", "seed": 1})
    split = federated_split(cfg.data, CLIENTS)
    labels = load_dataset("mnist", str(data_dir), False).y
    _assert_paper_split(labels, split.train, split.test)
    assert len(split.pool) == CLIENTS * PAPER_TEST
    other_fraction = federated_split(parse_run_config({**cfg.to_dict(), "test-fraction": 0.5}).data, CLIENTS)
    assert all(np.array_equal(a, b) for a, b in zip(split.test, other_fraction.test)), "test-fraction does not apply"
    reseeded = federated_split(parse_run_config({**cfg.to_dict(), "seed": 2}).data, CLIENTS)
    assert not np.array_equal(split.train[0], reseeded.train[0])
