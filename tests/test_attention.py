"""FedAMP / HeurFedAMP attention math against direct double-loop implementations of the paper's formulas."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_limits

import common.methods.attention as attention
from common.methods.attention import (
    cloud_models,
    fedamp_weights,
    fedamp_weights_from_gram,
    heurfedamp_weights,
    pairwise_cosine,
    pairwise_sq_distances,
)
from common.storage.pages import map_blocks


def _models(seed: int, m: int = 7, d: int = 50, spread: float = 0.3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.normal(size=d) + spread * rng.normal(size=(m, d))).astype(np.float32)


def _loop_distances(W: np.ndarray) -> np.ndarray:
    W = W.astype(np.float64)
    return np.array([[np.sum((W[i] - W[j]) ** 2) for j in range(len(W))] for i in range(len(W))])


def _loop_fedamp(W: np.ndarray, alpha_k: float, sigma: float) -> np.ndarray:
    """FedAMP's attention (FedAMP [arXiv:2007.03797] Sec. 4) written out, without the guard."""
    D = _loop_distances(W)
    m = len(W)
    xi = np.zeros((m, m))
    for i in range(m):
        for j in range(m):
            if j != i:
                xi[i, j] = alpha_k * np.exp(-D[i, j] / sigma) / sigma
        xi[i, i] = 1.0 - sum(xi[i, j] for j in range(m) if j != i)
    return xi


def _loop_heur(W: np.ndarray, sigma: float, tau: float) -> np.ndarray:
    """Eq. 10-11 written out: plain exponentials, no max subtraction."""
    W64 = W.astype(np.float64)
    m = len(W)
    xi = np.zeros((m, m))
    for i in range(m):
        sims = {
            j: np.exp(sigma * W64[i] @ W64[j] / (np.linalg.norm(W64[i]) * np.linalg.norm(W64[j])))
            for j in range(m)
            if j != i
        }
        total = sum(sims.values())
        for j, s in sims.items():
            xi[i, j] = tau * s / total
        xi[i, i] = 1.0 - tau
    return xi


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_distances_and_cosine_match_the_loop(seed: int) -> None:
    W = _models(seed)
    D = pairwise_sq_distances(W)
    ref = _loop_distances(W)
    assert D.shape == (7, 7)
    off = ~np.eye(7, dtype=bool)
    assert np.allclose(D[off], ref[off], rtol=1e-5, atol=0)
    assert np.all(np.diag(D) == 0) and np.array_equal(D, D.T)
    W64 = W.astype(np.float64)
    cos_ref = np.array([[a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) for b in W64] for a in W64])
    assert np.allclose(pairwise_cosine(W), cos_ref, rtol=0, atol=1e-12)


def test_distances_over_several_gram_blocks() -> None:
    W = _models(3, m=4, d=(1 << 16) + 123, spread=1.0)
    ref = _loop_distances(W)
    off = ~np.eye(4, dtype=bool)
    assert np.allclose(pairwise_sq_distances(W)[off], ref[off], rtol=1e-5, atol=0)


def test_zero_norm_model_has_cosine_zero() -> None:
    W = _models(4, m=3)
    W[1] = 0.0
    C = pairwise_cosine(W)
    assert np.all(C[1] == 0) and np.all(C[:, 1] == 0)
    assert C[0, 0] == pytest.approx(1.0) and np.all(np.isfinite(C))


@pytest.mark.parametrize(("alpha_k", "sigma"), [(0.01, 1.0), (1.0, 100.0), (5.0, 40.0), (1e-3, 0.5)])
def test_fedamp_weights_match_the_loop(alpha_k: float, sigma: float) -> None:
    W = _models(5, spread=0.2)
    xi, guarded = fedamp_weights(W, alpha_k, sigma)
    ref = _loop_fedamp(W, alpha_k, sigma)
    assert not guarded and np.all(np.diag(ref) >= 0)
    assert np.allclose(xi, ref, rtol=1e-5, atol=1e-15)
    assert np.allclose(xi.sum(axis=1), 1.0, rtol=0, atol=1e-12)


def test_guard_triggers_exactly_above_one() -> None:
    # Identical models: every off-diagonal weight is alpha_k / sigma, the row sum (m - 1) alpha_k / sigma.
    same = np.tile(np.linspace(-1, 1, 50, dtype=np.float32), (5, 1))
    xi, guarded = fedamp_weights(same, alpha_k=0.25, sigma=1.0)  # 4 * 0.25 == 1: not above one
    assert not guarded and np.all(np.diag(xi) == 0.0) and np.allclose(xi[~np.eye(5, dtype=bool)], 0.25)
    xi, guarded = fedamp_weights(same, alpha_k=0.125, sigma=1.0)
    assert not guarded and np.allclose(np.diag(xi), 0.5)
    xi, guarded = fedamp_weights(same, alpha_k=0.5, sigma=1.0)  # row sum 2 -> rescaled to 1, self 0
    assert guarded
    assert np.all(np.diag(xi) == 0.0) and np.allclose(xi[~np.eye(5, dtype=bool)], 0.25)
    assert np.allclose(xi.sum(axis=1), 1.0, rtol=0, atol=1e-12)


def test_guard_rescales_only_the_rows_that_need_it() -> None:
    rng = np.random.default_rng(6)
    W = np.concatenate([np.tile(rng.normal(size=50), (4, 1)), 100 * rng.normal(size=(3, 50))]).astype(np.float32)
    xi, guarded = fedamp_weights(W, alpha_k=0.5, sigma=1.0)
    ref = _loop_fedamp(W, 0.5, 1.0)
    assert guarded
    for i in range(4):  # the cluster: 3 * 0.5 > 1
        off = np.arange(7) != i
        assert xi[i, i] == 0.0
        assert np.allclose(xi[i, off], ref[i, off] / ref[i, off].sum(), rtol=1e-12)
    assert np.allclose(xi[4:], ref[4:], rtol=1e-12, atol=1e-300)  # far apart: untouched, self weight ~1
    assert np.allclose(xi.sum(axis=1), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("sigma", "tau"), [(1.0, 0.95), (25.0, 0.5), (10.0, 0.0), (3.0, 1.0)])
def test_heurfedamp_weights_match_the_loop(sigma: float, tau: float) -> None:
    W = _models(7)
    xi = heurfedamp_weights(W, sigma, tau)
    assert np.allclose(xi, _loop_heur(W, sigma, tau), rtol=1e-9, atol=1e-15)
    assert np.allclose(np.diag(xi), 1.0 - tau)
    assert np.allclose(xi.sum(axis=1), 1.0, rtol=0, atol=1e-12)


def test_heurfedamp_large_sigma_is_stable() -> None:
    W = _models(8)
    xi = heurfedamp_weights(W, sigma=1e5, tau=0.9)  # exp(sigma * cos) alone would overflow
    assert np.all(np.isfinite(xi)) and np.allclose(xi.sum(axis=1), 1.0, atol=1e-12)
    C = pairwise_cosine(W)
    np.fill_diagonal(C, -np.inf)
    assert np.array_equal(np.argmax(np.where(np.eye(7, dtype=bool), -1, xi), axis=1), np.argmax(C, axis=1))
    assert np.allclose(xi.max(axis=1, where=~np.eye(7, dtype=bool), initial=0), 0.9)


@pytest.mark.parametrize("heur", [False, True])
def test_cloud_models_equal_the_weighted_loop(heur: bool) -> None:
    W = _models(9, d=50)
    xi = heurfedamp_weights(W, 25.0, 0.95) if heur else fedamp_weights(W, 1.0, 100.0)[0]
    U = cloud_models(xi, W)
    assert U.dtype == np.float32 and U.shape == W.shape
    for i in range(7):
        u_i = sum(xi[i, j] * W[j].astype(np.float64) for j in range(7))
        assert np.allclose(U[i], u_i, rtol=1e-5, atol=1e-6)
    assert np.array_equal(cloud_models(xi, W, rows=[4, 1]), U[[4, 1]])


def test_identity_weights_give_back_the_local_models() -> None:
    W = _models(10)
    assert np.array_equal(cloud_models(np.eye(7), W), W)


@pytest.mark.parametrize(
    "weights",
    [
        lambda W, active: fedamp_weights(W, 1.0, 10.0, active=active)[0],
        lambda W, active: heurfedamp_weights(W, 5.0, 0.9, active=active),
    ],
)
def test_inactive_clients_take_no_part(weights) -> None:
    W = _models(11, spread=0.1)
    active = np.array([True, False, True, True, False, True, True])
    xi = weights(W, active)
    assert np.allclose(xi[np.ix_(active, active)], weights(W[active], None), rtol=1e-12, atol=1e-15)
    assert np.all(xi[np.ix_(active, ~active)] == 0)
    assert np.array_equal(xi[~active], np.eye(7)[~active])


def test_lone_active_client_keeps_itself() -> None:
    W = _models(12, m=3)
    xi = heurfedamp_weights(W, 5.0, 0.9, active=np.array([True, False, False]))
    assert np.array_equal(xi, np.eye(3))
    assert np.array_equal(heurfedamp_weights(W[:1], 5.0, 0.9), np.ones((1, 1)))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda W: fedamp_weights(W, 1.0, 0.0), "sigma"),
        (lambda W: heurfedamp_weights(W, 1.0, 1.5), "tau"),
        (lambda W: fedamp_weights(W[0], 1.0, 1.0), "clients x params"),
        (lambda W: cloud_models(np.eye(3), W), "expected"),
        (lambda W: attention.mix_rows(np.ones((2, 3)), W, [0, 1]), r"expected \(k, 2\)"),
        (lambda W: fedamp_weights(W, 1.0, 1.0, active=np.ones(3, bool)), "one flag per client"),
    ],
)
def test_bad_inputs_raise(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call(_models(13))


def test_constant_self_attention_matches_the_formula_on_hand_made_models() -> None:
    W = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    sigma, tau = 2.0, 0.3
    xi, guard = fedamp_weights_from_gram(W @ W.T, alpha_k=5.0, sigma=sigma, tau=tau)  # alpha_k plays no part
    assert not guard
    for i in range(4):
        a = {j: np.exp(-np.sum((W[i] - W[j]) ** 2) / sigma) / sigma for j in range(4) if j != i}  # A'(||w_i-w_j||^2)
        for j in range(4):
            expected = 1 - tau if j == i else tau * a[j] / sum(a.values())
            assert xi[i, j] == pytest.approx(expected, rel=1e-12, abs=1e-15)
    np.testing.assert_allclose(xi.sum(axis=1), 1.0, rtol=1e-12)


def test_constant_self_attention_survives_far_apart_models_and_lone_clients() -> None:
    W = np.array([[0.0], [1e4], [2e4]])  # exp(-1e8 / sigma) underflows: shares still add up to tau
    xi, _ = fedamp_weights_from_gram(W @ W.T, alpha_k=1.0, sigma=1.0, tau=0.5)
    np.testing.assert_allclose(xi[0], [0.5, 0.5, 0.0])
    np.testing.assert_allclose(xi[1], [0.25, 0.5, 0.25])
    lone, _ = fedamp_weights_from_gram(W @ W.T, 1.0, 1.0, active=np.array([True, False, False]), tau=0.5)
    np.testing.assert_allclose(lone, np.eye(3))


@pytest.mark.parametrize("on_disk", [False, True])
def test_gram_and_cloud_models_are_the_same_bits_on_any_number_of_threads(tmp_path, monkeypatch, on_disk: bool) -> None:
    monkeypatch.setattr(attention, "_GRAM_BLOCK_BYTES", 8 * 6 * 1024 * 2)  # 2,048-column blocks: 5 of them
    W = _models(3, m=6, d=9_000)
    if on_disk:
        W = attention.copy_to_store(W, tmp_path / "store.npy")
    xi = np.random.default_rng(4).random((6, 6))
    results = []
    with threadpool_limits(limits=1):  # the server's BLAS
        for threads in (1, 2, 3):
            monkeypatch.setattr(attention, "block_threads", lambda threads=threads: threads)
            results.append(
                (
                    attention.gram_rows(W),
                    attention.gram_rows(W, [4, 1, 5]),
                    attention.gram_rows(W, [2]),
                    cloud_models(xi, W),
                    cloud_models(xi, W, [5, 0]),
                    attention.gram_among(W, [4, 1, 5]),
                    attention.mix_rows(xi[:2, :3], W, [4, 1, 5]),
                )
            )
    for other in results[1:]:
        for first, again in zip(results[0], other):
            assert first.tobytes() == again.tobytes()
    whole, most, one, cloud, some, among, mixed = results[0]
    exact = W.astype(np.float64) @ W.astype(np.float64).T
    np.testing.assert_allclose(whole, exact, rtol=1e-12)
    assert np.array_equal(most, whole[[4, 1, 5]]), "half the rows or more: rows of the whole symmetric product"
    np.testing.assert_allclose(one, exact[[2]], rtol=1e-12)
    np.testing.assert_allclose(cloud, xi @ W.astype(np.float64), rtol=1e-4, atol=1e-4)
    assert np.array_equal(some, cloud[[5, 0]])
    np.testing.assert_allclose(among, exact[np.ix_([4, 1, 5], [4, 1, 5])], rtol=1e-12)  # those rows only
    np.testing.assert_allclose(mixed, xi[:2, :3] @ W[[4, 1, 5]].astype(np.float64), rtol=1e-4, atol=1e-4)


def _products(W: np.ndarray, xi: np.ndarray) -> list[np.ndarray]:
    return [
        attention.gram_rows(W),
        attention.gram_rows(W, [2]),
        attention.gram_among(W, [4, 1, 5]),
        attention.mix_rows(xi[:2], W),
        attention.mix_rows(xi[:2, :3], W, [4, 1, 5]),
    ]


@pytest.mark.parametrize("on_disk", [False, True])
def test_products_on_a_torch_device_match_numpys(tmp_path, monkeypatch, on_disk: bool) -> None:
    """Under products_on every block's product is made by torch on that device (here the CPU, as a GPU would) and
    the results are numpy's to rounding: Gram rows in float64, mixes in float32; outside it numpy's path is back."""
    monkeypatch.setattr(attention, "_GRAM_BLOCK_BYTES", 8 * 6 * 1024 * 2)  # several blocks
    W = _models(5, m=6, d=9_000)
    if on_disk:
        W = attention.copy_to_store(W, tmp_path / "store.npy")
    xi = np.random.default_rng(6).random((6, 6))
    moved: list[str] = []
    to_torch = attention._on_device
    monkeypatch.setattr(attention, "_on_device", lambda a, device, *d: moved.append(device) or to_torch(a, device, *d))
    numpys = _products(W, xi)
    assert moved == []
    with attention.products_on("cpu"):
        torchs = _products(W, xi)
    assert moved and set(moved) == {"cpu"}
    assert attention._PRODUCTS_DEVICE is None
    for ours, theirs in zip(torchs, numpys, strict=True):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        np.testing.assert_allclose(ours, theirs, rtol=1e-12 if ours.dtype == np.float64 else 1e-5, atol=1e-5)


def test_model_matrix_brings_its_gram_rows_up_to_date_on_its_device(monkeypatch) -> None:
    matrix = attention.ModelMatrix(4, np.zeros(3000, np.float32))
    rows = _models(7, m=4, d=3000)
    matrix.set_rows([0, 1, 2, 3], rows)
    seen: list[str | None] = []
    gram_rows = attention.gram_rows
    monkeypatch.setattr(attention, "gram_rows", lambda *a: seen.append(attention._PRODUCTS_DEVICE) or gram_rows(*a))
    matrix.device = "cpu"
    np.testing.assert_allclose(matrix.G, rows.astype(np.float64) @ rows.astype(np.float64).T, rtol=1e-12)
    assert seen == ["cpu"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_products_on_the_gpu_match_numpys() -> None:
    W, xi = _models(8, m=6, d=70_000), np.random.default_rng(9).random((6, 6))
    numpys = _products(W, xi)
    with attention.products_on("cuda"):
        gpus = _products(W, xi)
    for ours, theirs in zip(gpus, numpys, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12 if ours.dtype == np.float64 else 1e-5, atol=1e-5)


def test_map_blocks_keeps_the_order_and_takes_no_block_before_its_scratch_is_free() -> None:
    taken: list[int] = []
    done: set[int] = set()

    def blocks():
        for k in range(10):
            assert k < 3 or k - 3 in done, f"block {k} taken before block {k - 3} was done"
            taken.append(k)
            yield k

    def work(k: int) -> int:
        time.sleep(0.01)  # still busy when a careless pipeline would take the next blocks
        done.add(k)
        return k * k

    assert list(map_blocks(work, blocks(), 3)) == [k * k for k in range(10)]
    assert list(map_blocks(work, iter(range(4)), 1)) == [0, 1, 4, 9]
