"""Sparse masks: ERK densities, random masks, mask algebra, prune-and-regrow and top-k on hand-made tensors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from common.learning.models import build_model
from common.methods.masks import (
    _select,
    apply_masks,
    cosine_decay,
    erk_densities,
    mask_and,
    mask_and_not,
    mask_count,
    mask_density,
    mask_or,
    prunable_names,
    prune_and_regrow,
    random_masks,
    topk_mask,
)

T, F = True, False


def _cnn_shapes() -> dict[str, tuple[int, ...]]:
    model = build_model("cnn-mnist", "mnist", (1, 28, 28), 10, seed=0)
    state = model.state_dict()
    return {name: tuple(state[name].shape) for name in prunable_names(model)}


def _b(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bool)


def test_prunable_names_are_conv_and_linear_weights_only() -> None:
    model = build_model("cnn-mnist", "mnist", (1, 28, 28), 10, seed=0)
    assert prunable_names(model) == ["body.0.weight", "body.3.weight", "body.7.weight", "head.weight"]
    normed = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LayerNorm(4), nn.Linear(4, 2))
    assert prunable_names(normed) == ["0.weight", "4.weight"]
    assert prunable_names(nn.Linear(3, 2)) == ["weight"]


@pytest.mark.parametrize("sparsity", [0.5, 0.8, 0.9])
def test_erk_total_density_is_exact_on_the_mnist_cnn(sparsity: float) -> None:
    shapes = _cnn_shapes()
    densities = erk_densities(shapes, 1 - sparsity)
    numel = {name: int(np.prod(shape)) for name, shape in shapes.items()}
    kept = sum(densities[name] * numel[name] for name in shapes)
    assert abs(kept / sum(numel.values()) - (1 - sparsity)) < 1e-6
    assert all(0 < d <= 1 for d in densities.values())
    # ERK: a layer with a larger (sum of dims / product of dims) never gets a lower density
    raw = {name: sum(shape) / numel[name] for name, shape in shapes.items()}
    for a in shapes:
        for b in shapes:
            if raw[a] > raw[b]:
                assert densities[a] >= densities[b], (a, b)


def test_erk_small_conv_and_head_become_dense_at_half_density() -> None:
    densities = erk_densities(_cnn_shapes(), 0.5)
    assert densities["body.0.weight"] == 1.0 and densities["head.weight"] == 1.0
    assert densities["body.3.weight"] < 1.0 and densities["body.7.weight"] < 1.0
    # body.3 (64x32x5x5: 106/51200) is "thinner" than body.7 (512x3136: 3648/1605632), so sparser
    assert densities["body.3.weight"] < densities["body.7.weight"]


def test_erk_tiny_layer_is_dense_and_the_rest_rescaled_exactly() -> None:
    densities = erk_densities({"a": (4, 3), "b": (1000, 1000)}, 0.5)
    assert densities["a"] == 1.0
    assert densities["b"] == pytest.approx((0.5 * 1_000_012 - 12) / 1_000_000, abs=1e-12)
    assert densities["a"] * 12 + densities["b"] * 1_000_000 == pytest.approx(0.5 * 1_000_012, abs=1e-6)


def test_erk_without_overflow_is_proportional_to_the_raw_score() -> None:
    densities = erk_densities({"a": (10, 10), "b": (20, 20)}, 0.1)
    # raw scores 20/100 and 40/400: eps * (0.2 * 100 + 0.1 * 400) = 0.1 * 500 -> eps = 5/6
    assert densities["a"] == pytest.approx(0.2 * 5 / 6)
    assert densities["b"] == pytest.approx(0.1 * 5 / 6)


def test_erk_power_zero_is_uniform_and_density_one_is_dense() -> None:
    assert erk_densities({"a": (4, 3), "b": (30, 20)}, 0.3, erk_power_scale=0.0) == pytest.approx({"a": 0.3, "b": 0.3})
    assert erk_densities({"a": (4, 3), "b": (30, 20)}, 1.0) == {"a": 1.0, "b": 1.0}


@pytest.mark.parametrize("density", [0.0, -0.1, 1.5, float("nan")])
def test_erk_rejects_bad_density(density: float) -> None:
    with pytest.raises(ValueError, match="density"):
        erk_densities({"a": (4, 3)}, density)


def test_random_masks_have_exact_counts_and_follow_the_seed() -> None:
    shapes = _cnn_shapes()
    densities = erk_densities(shapes, 0.2)
    masks = random_masks(shapes, densities, torch.Generator().manual_seed(7))
    for name, shape in shapes.items():
        assert masks[name].dtype == torch.bool and tuple(masks[name].shape) == shape
        assert int(masks[name].sum()) == round(densities[name] * int(np.prod(shape)))
    again = random_masks(shapes, densities, torch.Generator().manual_seed(7))
    other = random_masks(shapes, densities, torch.Generator().manual_seed(8))
    assert all(torch.equal(masks[n], again[n]) for n in shapes)
    assert not all(torch.equal(masks[n], other[n]) for n in shapes if densities[n] < 1)
    assert random_masks({"x": (3, 5)}, {"x": 0.0}, torch.Generator().manual_seed(0))["x"].sum() == 0


def test_mask_count_and_density() -> None:
    masks = {"a": _b([T, F, F, F]), "b": _b([[T, T], [F, T]])}
    assert mask_count(masks) == 4
    assert mask_density(masks) == 0.5
    # with shapes: unmasked tensors (a bias) count as dense
    assert mask_density({"a": _b([T, F, F, F])}, {"a": (4,), "bias": (4,)}) == 5 / 8


def test_mask_algebra_truth_tables() -> None:
    a = {"x": _b([T, T, F, F]), "y": _b([[T], [F]])}
    b = {"x": _b([T, F, T, F]), "y": _b([[T], [T]])}
    assert torch.equal(mask_and(a, b)["x"], _b([T, F, F, F]))
    assert torch.equal(mask_or(a, b)["x"], _b([T, T, T, F]))
    assert torch.equal(mask_and_not(a, b)["x"], _b([F, T, F, F]))
    assert torch.equal(mask_and(a, b)["y"], _b([[T], [F]]))
    assert torch.equal(mask_or(a, b)["y"], _b([[T], [T]]))
    assert torch.equal(mask_and_not(a, b)["y"], _b([[F], [F]]))
    assert torch.equal(a["x"], _b([T, T, F, F]))


@pytest.mark.parametrize("op", [mask_and, mask_or, mask_and_not])
def test_mask_algebra_rejects_mismatches(op) -> None:
    a = {"x": _b([T, F]), "y": _b([T])}
    with pytest.raises(ValueError, match="'y'"):
        op(a, {"x": _b([T, F])})
    with pytest.raises(ValueError, match="'z'"):
        op(a, {"x": _b([T, F]), "y": _b([T]), "z": _b([T])})
    with pytest.raises(ValueError, match="'x'"):
        op(a, {"x": _b([T, F, T]), "y": _b([T])})


def test_apply_masks_zeroes_masked_out_and_copies() -> None:
    params = {"w": torch.tensor([[1.0, -2.0], [3.0, 4.0]]), "bias": torch.tensor([5.0, 6.0])}
    out = apply_masks(params, {"w": _b([[T, F], [F, T]])})
    assert torch.equal(out["w"], torch.tensor([[1.0, 0.0], [0.0, 4.0]]))
    assert torch.equal(out["bias"], params["bias"])
    out["bias"][0] = 99.0
    assert torch.equal(params["w"], torch.tensor([[1.0, -2.0], [3.0, 4.0]]))
    assert params["bias"][0] == 5.0
    with pytest.raises(ValueError, match="'w'"):
        apply_masks(params, {"w": _b([T, F])})
    with pytest.raises(ValueError, match="'nope'"):
        apply_masks(params, {"nope": _b([T])})


def test_prune_and_regrow_by_hand_with_a_pruned_position_regrowing() -> None:
    weights = {"w": torch.tensor([0.5, -0.1, 0.7, 2.0, 0.3, -0.05]), "bias": torch.tensor([1.0])}
    grads = {"w": torch.tensor([9.0, 0.2, 0.7, 9.0, 0.1, -3.0]), "bias": torch.tensor([0.0])}
    masks = {"w": _b([T, T, F, T, F, T])}
    copies = ({k: v.clone() for k, v in weights.items()}, {k: v.clone() for k, v in grads.items()}, masks["w"].clone())
    new_masks, new_weights = prune_and_regrow(weights, grads, masks, 0.5)
    # 4 active -> k = 2; prune |w| smallest among {0,1,3,5}: 5 (0.05), 1 (0.1)
    # regrow |g| largest among inactive-after-prune {1,2,4,5}: 5 (3.0, just pruned), 2 (0.7)
    assert torch.equal(new_masks["w"], _b([T, F, T, T, F, T]))
    assert torch.equal(new_weights["w"], torch.tensor([0.5, 0.0, 0.0, 2.0, 0.3, 0.0]))
    assert torch.equal(new_weights["bias"], torch.tensor([1.0]))
    assert int(new_masks["w"].sum()) == int(masks["w"].sum())
    assert torch.equal(weights["w"], copies[0]["w"]) and torch.equal(grads["w"], copies[1]["w"])
    assert torch.equal(masks["w"], copies[2])


def test_prune_and_regrow_2d_by_hand() -> None:
    weights = {"w": torch.tensor([[3.0, -9.0, 4.0], [-1.0, 2.0, 8.0]])}
    grads = {"w": torch.tensor([[0.0, 5.0, 1.0], [0.0, 0.0, -6.0]])}
    masks = {"w": _b([[T, F, F], [T, T, F]])}
    new_masks, new_weights = prune_and_regrow(weights, grads, masks, 0.34)
    # 3 active -> k = round(1.02) = 1; prune (1, 0) (|-1|); regrow (1, 2) (|-6| beats |5| at (0, 1))
    assert torch.equal(new_masks["w"], _b([[T, F, F], [F, T, T]]))
    assert torch.equal(new_weights["w"], torch.tensor([[3.0, -9.0, 4.0], [0.0, 2.0, 0.0]]))


def test_prune_and_regrow_ties_go_to_the_lower_index() -> None:
    weights = {"w": torch.ones(2, 2)}
    grads = {"w": torch.ones(2, 2)}
    masks = {"w": _b([[T, T], [T, F]])}
    new_masks, new_weights = prune_and_regrow(weights, grads, masks, 0.34)
    # prune flat 0 (first of the tied |w|); regrow among {0, 3} with tied |g|: flat 0 again, now at weight 0
    assert torch.equal(new_masks["w"], masks["w"])
    assert torch.equal(new_weights["w"], torch.tensor([[0.0, 1.0], [1.0, 1.0]]))


def test_prune_and_regrow_fraction_zero_changes_nothing_and_bad_fraction_raises() -> None:
    weights = {"w": torch.tensor([0.5, -0.1, 0.7])}
    grads = {"w": torch.tensor([1.0, 2.0, 3.0])}
    masks = {"w": _b([T, T, F])}
    new_masks, new_weights = prune_and_regrow(weights, grads, masks, 0.0)
    assert torch.equal(new_masks["w"], masks["w"]) and torch.equal(new_weights["w"], weights["w"])
    assert new_masks["w"] is not masks["w"] and new_weights["w"] is not weights["w"]
    for bad in (-0.01, 1.01):
        with pytest.raises(ValueError, match="fraction"):
            prune_and_regrow(weights, grads, masks, bad)


def test_prune_and_regrow_keeps_counts_on_a_random_model() -> None:
    shapes = _cnn_shapes()
    gen = torch.Generator().manual_seed(3)
    masks = random_masks(shapes, erk_densities(shapes, 0.2), gen)
    weights = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    grads = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    new_masks, new_weights = prune_and_regrow(weights, grads, masks, 0.05)
    for name in shapes:
        assert int(new_masks[name].sum()) == int(masks[name].sum())
        regrown = new_masks[name] & ~masks[name]
        assert torch.all(new_weights[name][regrown] == 0)
        # only pruned or regrown positions change (a pruned-and-regrown one stays active but is now 0)
        changed = new_weights[name] != weights[name]
        assert torch.all(new_weights[name][changed] == 0)
        assert int(changed.sum()) <= 2 * round(0.05 * int(masks[name].sum()))
        if not masks[name].all():
            assert int((new_masks[name] ^ masks[name]).sum()) > 0


def test_cosine_decay_values() -> None:
    assert cosine_decay(0.05, 0, 10) == 0.05
    assert cosine_decay(0.05, 5, 10) == pytest.approx(0.025)
    assert cosine_decay(0.05, 2, 8) == pytest.approx(0.05 * (1 + math.cos(math.pi / 4)) / 2)
    assert cosine_decay(0.05, 10, 10) == 0.0
    assert cosine_decay(0.05, 12, 10) == 0.0
    assert cosine_decay(0.05, 0, 0) == 0.0


def test_topk_mask_with_and_without_eligible() -> None:
    values = torch.tensor([0.1, -5.0, 3.0, 0.2, -0.3, 4.0])
    assert torch.equal(topk_mask(values, 0.5), _b([F, T, T, F, F, T]))
    eligible = _b([T, F, T, T, T, F])
    assert torch.equal(topk_mask(values, 0.5, eligible), _b([F, F, T, T, T, F]))
    # only one eligible position though k = 3: keep just that one
    assert torch.equal(topk_mask(values, 0.5, _b([F, F, F, F, T, F])), _b([F, F, F, F, T, F]))
    assert torch.equal(topk_mask(values, 0.0), torch.zeros(6, dtype=torch.bool))
    assert torch.equal(topk_mask(torch.ones(2, 2), 0.5), _b([[T, T], [F, F]]))
    with pytest.raises(ValueError):
        topk_mask(values, 0.5, _b([T, F]))
    with pytest.raises(ValueError, match="density"):
        topk_mask(values, 1.5)


@pytest.mark.parametrize("largest", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_selection_is_the_first_k_of_a_stable_sort_ties_included(seed: int, largest: bool) -> None:
    rng = np.random.default_rng(seed)
    scores = torch.from_numpy(rng.integers(0, 5, size=400).astype(np.float32))  # many ties
    scores[rng.integers(0, 400, size=20)] = -0.0  # -0.0 ties with 0.0
    candidates = torch.from_numpy(np.sort(rng.choice(400, size=250, replace=False)))
    for k in (0, 1, 37, 120, 249, 250, 300):
        order = torch.sort(scores[candidates], descending=largest, stable=True).indices
        expected = set(candidates[order][:k].tolist())
        assert set(_select(scores, candidates, k, largest).tolist()) == expected


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (gradients of a model trained there)")
def test_prune_and_regrow_takes_gradients_from_a_gpu() -> None:
    # a DM-PFL or FedDST client training on a GPU collects its gradients there, its weights and masks on the CPU
    weights = {"w": torch.tensor([[0.5, -0.1], [0.0, 2.0]])}
    masks = {"w": torch.tensor([[True, True], [False, True]])}
    grads = {"w": torch.tensor([[0.0, 0.0], [3.0, 0.0]]).cuda()}
    new_masks, new_weights = prune_and_regrow(weights, grads, masks, 1 / 3)
    assert new_masks["w"].tolist() == [[True, False], [True, True]]  # -0.1 pruned, the gradient's 3.0 regrown
    assert new_weights["w"].tolist() == [[0.5, 0.0], [0.0, 2.0]]
