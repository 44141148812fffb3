"""FLIU's LS / QS / LSQS and FedAMP's grouped partitions: margins, skews, exact cover, seeding."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from common.data.datasets import DataError
from common.data.partition import grouped, label_skew_ls, lsqs, partition, quantity_skew_qs, sinkhorn_knopp

LABELS = np.random.default_rng(21).integers(0, 10, size=8000)
# Unequal classes: equal client sizes must not rely on balanced classes.
UNEVEN = np.random.default_rng(22).choice(10, size=7000, p=np.linspace(1, 3, 10) / np.linspace(1, 3, 10).sum())


def _assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts)
    assert len(joined) == n, "a sample was lost or duplicated"
    assert np.array_equal(np.sort(joined), np.arange(n))
    assert all(p.dtype == np.int64 for p in parts)


def _counts(labels: np.ndarray, parts: list[np.ndarray]) -> np.ndarray:
    return np.stack([np.bincount(labels[p], minlength=10) for p in parts])


def _mean_dominant_share(labels: np.ndarray, parts: list[np.ndarray]) -> float:
    counts = _counts(labels, parts)
    return float(np.mean(counts.max(axis=1) / counts.sum(axis=1)))


def _size_ratio(parts: list[np.ndarray]) -> float:
    sizes = np.array([len(p) for p in parts])
    return float(sizes.max() / sizes.min())


def test_sinkhorn_reaches_the_spec_margins() -> None:
    K, L = 20, 10
    P = np.random.default_rng(0).dirichlet([0.3] * L, size=K) + 1e-12
    S = sinkhorn_knopp(P, np.full(K, L / K), np.ones(L))
    assert np.allclose(S.sum(axis=0), 1.0, rtol=0, atol=1e-6)
    assert np.allclose(S.sum(axis=1), L / K, rtol=0, atol=1e-6)
    # Sinkhorn only rescales rows and columns: S = diag(r) P diag(c), so every 2x2 cross ratio is kept.
    assert np.allclose(S[0, 0] * S[1, 1] / (S[0, 1] * S[1, 0]), P[0, 0] * P[1, 1] / (P[0, 1] * P[1, 0]))


def test_sinkhorn_best_effort_returns_exact_columns_when_it_runs_out_of_iterations() -> None:
    matrix = np.array([[1.0, 1.0], [1.0, 0.0]])  # no matrix with this zero pattern has the margins below
    out = sinkhorn_knopp(matrix, [0.5, 1.5], [1.5, 0.5], max_iter=200, best_effort=True)
    np.testing.assert_allclose(out.sum(axis=0), [1.5, 0.5])
    assert out[1, 1] == 0.0


@pytest.mark.parametrize("split", [label_skew_ls, lsqs])
def test_ls_never_fails_when_sinkhorn_stops_early(monkeypatch, split) -> None:
    from common.data import partition as module

    real = module.sinkhorn_knopp
    monkeypatch.setattr(module, "sinkhorn_knopp", lambda *args, **kwargs: real(*args, **{**kwargs, "max_iter": 2}))
    labels = LABELS[:1000]
    parts = split(labels, 5, 0.05, 3)
    joined = np.concatenate(parts)
    assert np.array_equal(np.sort(joined), np.arange(len(labels))), "every sample used once"
    if split is label_skew_ls:
        assert {len(p) for p in parts} == {200}, "equal client sizes, as LS promises"


def test_sinkhorn_rejects_impossible_targets() -> None:
    with pytest.raises(DataError, match="sum to"):
        sinkhorn_knopp(np.ones((2, 2)), [1.0, 1.0], [1.0, 2.0])
    with pytest.raises(DataError, match="all zero"):
        sinkhorn_knopp(np.array([[1.0, 0.0], [1.0, 0.0]]), [1.0, 1.0], [1.0, 1.0])
    with pytest.raises(DataError, match="did not reach"):
        # Zero pattern that admits no matrix with these margins.
        sinkhorn_knopp(np.array([[1.0, 1.0], [1.0, 0.0]]), [0.5, 1.5], [1.5, 0.5], max_iter=200)


@pytest.mark.parametrize("labels", [LABELS, UNEVEN], ids=["even", "uneven"])
@pytest.mark.parametrize("num_clients", [10, 30])
def test_ls_equal_sizes_all_samples_used(labels: np.ndarray, num_clients: int) -> None:
    parts = label_skew_ls(labels, num_clients, alpha=0.5, seed=1)
    _assert_exact_cover(parts, len(labels))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert sum(sizes) == len(labels)


def test_ls_follows_the_dirichlet_rows_after_sinkhorn() -> None:
    K, alpha, seed = 10, 0.5, 4
    parts = label_skew_ls(LABELS, K, alpha=alpha, seed=seed)
    class_sizes = np.bincount(LABELS, minlength=10)
    rows = np.maximum(np.random.default_rng(seed).dirichlet([alpha] * 10, size=K), 1e-12)
    expected = sinkhorn_knopp(rows, np.full(K, len(LABELS) / K), class_sizes)
    assert np.abs(_counts(LABELS, parts) - expected).max() <= 3


def test_ls_skew_grows_as_alpha_shrinks() -> None:
    def share(alpha: float) -> float:
        return _mean_dominant_share(LABELS, label_skew_ls(LABELS, 20, alpha=alpha, seed=0))

    assert share(0.1) > share(1.0) + 0.2 > share(100.0) + 0.2


def test_qs_balanced_labels_skewed_sizes() -> None:
    parts = quantity_skew_qs(LABELS, 20, alpha=0.5, seed=2)
    _assert_exact_cover(parts, len(LABELS))
    assert min(len(p) for p in parts) >= 2
    overall = np.bincount(LABELS, minlength=10) / len(LABELS)
    counts = _counts(LABELS, parts)
    for row in counts:
        # Each class is split in proportion to the client sizes: within 2 samples of the exact share.
        assert np.abs(row - overall * row.sum()).max() <= 2
    assert _size_ratio(parts) > 10


@pytest.mark.parametrize(("split", "K", "alpha", "seed"), [(quantity_skew_qs, 20, 0.5, 3), (lsqs, 15, 1.0, 6)])
def test_sizes_follow_the_dirichlet_draw(split, K: int, alpha: float, seed: int) -> None:
    parts = split(LABELS, K, alpha=alpha, seed=seed)
    share = np.random.default_rng(seed).dirichlet([alpha] * K)
    expected = 2 + share * (len(LABELS) - 2 * K)
    assert np.abs(np.array([len(p) for p in parts]) - expected).max() < 1


def test_qs_size_skew_grows_as_alpha_shrinks() -> None:
    def ratio(alpha: float) -> float:
        return _size_ratio(quantity_skew_qs(LABELS, 20, alpha=alpha, seed=0))

    assert ratio(0.1) > ratio(1.0) > ratio(100.0)
    assert ratio(100.0) < 2


def test_lsqs_has_both_skews() -> None:
    parts = lsqs(LABELS, 20, alpha=0.3, seed=5)
    _assert_exact_cover(parts, len(LABELS))
    assert min(len(p) for p in parts) >= 2
    assert _size_ratio(parts) > 10
    big = [p for p in parts if len(p) >= 100]
    assert _mean_dominant_share(LABELS, big) > 0.5
    qs_share = _mean_dominant_share(LABELS, [p for p in quantity_skew_qs(LABELS, 20, 0.3, 5) if len(p) >= 100])
    assert qs_share < 0.15


@pytest.mark.parametrize("scheme", ["ls", "qs", "lsqs", "grouped"])
def test_seeded_through_partition(scheme: str) -> None:
    labels = np.random.default_rng(23).integers(0, 10, size=20000)
    parts = partition(labels, scheme, 20, seed=3, alpha=0.5)
    again = partition(labels, scheme, 20, seed=3, alpha=0.5)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partition(labels, scheme, 20, seed=4, alpha=0.5)
    assert any(not np.array_equal(np.sort(a), np.sort(b)) for a, b in zip(parts, other))
    if scheme != "grouped":
        _assert_exact_cover(parts, len(labels))


@pytest.mark.parametrize("scheme", ["ls", "qs", "lsqs"])
def test_nonpositive_alpha_is_a_clear_error(scheme: str) -> None:
    with pytest.raises(DataError, match="alpha > 0"):
        partition(LABELS, scheme, 10, seed=0, alpha=0.0)


def test_grouped_matches_the_fedamp_setting() -> None:
    labels = np.random.default_rng(24).integers(0, 10, size=20000)
    parts = grouped(labels, 20, seed=7)
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined), "a sample went to two clients"
    counts = _counts(labels, parts)
    for k, row in enumerate(counts):
        g = k // 4
        assert row.sum() == (500, 400, 300, 200, 100)[g]
        dominant = [2 * g, 2 * g + 1]
        assert abs(row[dominant].sum() - 0.8 * row.sum()) <= 1
        assert abs(row[dominant[0]] - row[dominant[1]]) <= 1
        others = np.delete(row, dominant)
        assert others.max() - others.min() <= 1 and others.sum() == row.sum() - row[dominant].sum()


def test_grouped_uneven_groups_and_other_shares() -> None:
    labels = np.random.default_rng(25).integers(0, 10, size=20000)
    parts = grouped(labels, 7, seed=0, num_groups=3, dominant_share=0.6, group_sizes=(300, 200, 100))
    groups = np.arange(7) * 3 // 7
    assert [len(p) for p in parts] == [(300, 200, 100)[g] for g in groups]
    counts = _counts(labels, parts)
    for row, g in zip(counts, groups):
        assert abs(row[[2 * g, 2 * g + 1]].sum() - 0.6 * row.sum()) <= 1


def test_grouped_scales_down_on_small_data() -> None:
    labels = np.random.default_rng(26).integers(0, 10, size=3000)
    with pytest.warns(UserWarning, match="scaled by"):
        parts = grouped(labels, 20, seed=0)
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined)
    assert np.all(_counts(labels, parts).sum(axis=0) <= np.bincount(labels, minlength=10))
    sizes = np.array([len(p) for p in parts])
    assert np.all(np.diff(sizes[::4]) < 0) and sizes[0] >= 50 and sizes[0] < 500


def test_grouped_too_small_is_a_clear_error() -> None:
    labels = np.random.default_rng(27).integers(0, 10, size=200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DataError, match="cannot hold even 10%"):
            grouped(labels, 20, seed=0)
    with pytest.raises(DataError, match="group sizes for"):
        grouped(LABELS, 20, seed=0, group_sizes=(100, 100))
