"""Partitioners: sizes, label skew as the Dirichlet partition defines it (Hsu et al. 2019, arXiv:1909.06335),
nothing lost or duplicated, seeded."""

from __future__ import annotations

import numpy as np
import pytest

from common.data.datasets import DataError
from common.data.partition import _top_up, dirichlet, iid, partition, pathological, train_test_split

LABELS = np.random.default_rng(7).integers(0, 10, size=6000)


def _assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts)
    assert len(joined) == n, "a sample was lost or duplicated"
    assert np.array_equal(np.sort(joined), np.arange(n))


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "pathological"])
def test_every_sample_assigned_once_and_seeded(scheme: str) -> None:
    parts = partition(LABELS, scheme, 20, seed=3, alpha=0.3)
    assert len(parts) == 20
    _assert_exact_cover(parts, len(LABELS))
    again = partition(LABELS, scheme, 20, seed=3, alpha=0.3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partition(LABELS, scheme, 20, seed=4, alpha=0.3)
    assert any(not np.array_equal(np.sort(a), np.sort(b)) for a, b in zip(parts, other))


def test_iid_equal_sizes_and_balanced_labels() -> None:
    parts = iid(LABELS, 10, seed=0)
    assert {len(p) for p in parts} == {600}
    overall = np.bincount(LABELS, minlength=10) / len(LABELS)
    for p in parts:
        assert np.abs(np.bincount(LABELS[p], minlength=10) / len(p) - overall).max() < 0.06


def _reference_dirichlet(labels: np.ndarray, num_clients: int, alpha: float, seed: int) -> list[set[int]]:
    """The Dirichlet label skew (Hsu et al. 2019, arXiv:1909.06335) written out: per class, a C-dim Dir(alpha)
    vector; the class's samples assigned proportionally."""
    rng = np.random.default_rng(seed)
    parts: list[set[int]] = [set() for _ in range(num_clients)]
    for k in sorted(np.unique(labels)):
        idx = np.flatnonzero(labels == k)
        share = rng.dirichlet([alpha] * num_clients)
        cuts = (np.cumsum(share) * len(idx)).astype(int)[:-1]
        for c, chunk in enumerate(np.split(idx, cuts)):
            parts[c].update(chunk.tolist())
    return parts


def test_dirichlet_matches_the_spec_definition() -> None:
    parts = dirichlet(LABELS, 10, alpha=0.5, seed=11)
    reference = _reference_dirichlet(LABELS, 10, 0.5, 11)
    assert [set(p.tolist()) for p in parts] == reference


def test_dirichlet_skew_grows_as_alpha_shrinks() -> None:
    def mean_dominant_share(alpha: float) -> float:
        parts = dirichlet(LABELS, 20, alpha=alpha, seed=0)
        return float(np.mean([np.bincount(LABELS[p], minlength=10).max() / len(p) for p in parts]))

    assert mean_dominant_share(0.1) > mean_dominant_share(1.0) + 0.2 > mean_dominant_share(100.0) + 0.2


def test_dirichlet_tops_up_small_clients_from_the_largest_in_their_preferred_class() -> None:
    labels = LABELS[:600]
    untouched = _reference_dirichlet(labels, 100, 0.05, 2)
    assert min(len(p) for p in untouched) < 5, "the plain draw must leave some client short for this test"
    parts = dirichlet(labels, 100, alpha=0.05, seed=2, min_size=5)
    _assert_exact_cover(parts, len(labels))
    assert min(len(p) for p in parts) == 5
    moved = sum(len(set(p.tolist()) - ref) for p, ref in zip(parts, untouched))
    short = sum(max(0, 5 - len(ref)) for ref in untouched)
    assert moved == short, "only the missing samples move"
    # the clients that already had the minimum keep or lose samples, never gain any
    assert all(set(p.tolist()) <= ref for p, ref in zip(parts, untouched) if len(ref) >= 5)


def test_top_up_takes_from_the_largest_client_in_the_recipients_preferred_held_class() -> None:
    counts = np.array([[4, 0, 3], [0, 0, 1], [2, 5, 0]])
    preference = np.array([[0.3, 0.3, 0.4], [0.1, 0.7, 0.2], [0.5, 0.5, 0.0]])
    # client 1 prefers class 1, which the largest client (0, first of the ties) lacks: class 2; then client 2 is the
    # largest and holds class 1
    assert _top_up(counts, preference, 3) == [(0, 1, 2), (2, 1, 1)]
    assert counts.tolist() == [[4, 0, 3], [0, 0, 1], [2, 5, 0]], "the caller's counts are left alone"


def test_dirichlet_reaches_a_thousand_clients() -> None:
    parts = dirichlet(LABELS, 1000, alpha=0.3, seed=0)
    _assert_exact_cover(parts, len(LABELS))
    assert min(len(p) for p in parts) >= 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_clients": 25, "alpha": 0.3, "min_size": 3}, "use at most 20 clients"),
        ({"num_clients": 10, "alpha": 0.0}, "dirichlet-alpha > 0"),
    ],
)
def test_dirichlet_infeasible_request_is_a_one_line_error(kwargs: dict, message: str) -> None:
    with pytest.raises(DataError, match=message) as info:
        dirichlet(LABELS[:60], seed=0, **kwargs)
    assert "\n" not in str(info.value)


def test_pathological_two_classes_and_quantity_skew() -> None:
    labels = np.random.default_rng(1).integers(0, 10, size=20000)
    parts = pathological(labels, 100, seed=5)
    _assert_exact_cover(parts, len(labels))
    assert all(len(np.unique(labels[p])) == 2 for p in parts)
    sizes = np.sort([len(p) for p in parts])[::-1]
    big_share = sizes[:10].sum() / len(labels)
    assert 0.4 < big_share < 0.6, f"the largest 10% of clients hold {big_share:.2f}, expected about half"
    holders = np.bincount(np.concatenate([np.unique(labels[p]) for p in parts]), minlength=10)
    assert set(holders.tolist()) == {20}, "every class is held by the same number of clients"


def test_too_many_clients_is_a_clear_error() -> None:
    with pytest.raises(DataError, match="each client needs at least 2"):
        partition(LABELS[:10], "iid", 6, seed=0)


def test_train_test_split_75_25() -> None:
    idx = np.arange(100, 500)
    train, test = train_test_split(idx, 0.25, seed=2)
    assert len(test) == 100 and len(train) == 300
    assert not set(train) & set(test)
    assert np.array_equal(np.sort(np.concatenate([train, test])), idx)
    tiny_train, tiny_test = train_test_split(np.array([4, 9]), 0.25, seed=0)
    assert len(tiny_train) == 1 and len(tiny_test) == 1


def test_the_partition_registry_is_the_keys_choices_and_its_keys_exist() -> None:
    from common.config import PARTITIONS, known_keys
    from common.data.partitioners import PARTITION_SPECS

    assert PARTITIONS == tuple(PARTITION_SPECS)
    for spec in PARTITION_SPECS.values():
        assert set(spec.reads) <= set(known_keys()), spec.name
        assert spec.summary and "\n" not in spec.summary


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "pathological", "qs"])
def test_a_registered_split_gives_disjoint_train_and_test_indices(scheme: str) -> None:
    from common.config import parse_run_config
    from common.data.federated import federated_split

    cfg = parse_run_config({"dataset": "digits", "partition": scheme, "seed": 3})
    split = federated_split(cfg.data, 3)
    every = np.concatenate([*split.train, *split.test])
    assert len(split.train) == len(split.test) == 3
    assert len(every) == len(np.unique(every)), "no sample lands in two sets"
    again = federated_split(cfg.data, 3)
    assert all(np.array_equal(a, b) for a, b in zip(split.train, again.train))
