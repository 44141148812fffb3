"""The fast masked gather, scatter, select and restore give their slow forms' results bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.methods.masked_ops import TensorRestore, gather, keep, scatter, select


def _case(shape: tuple[int, ...], seed: int, density: float = 0.3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    a.reshape(-1)[::7] = -0.0  # signed zeros must survive as they are
    b.reshape(-1)[::5] = -0.0
    return a, b, rng.random(shape) < density


def _same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    return x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x.view(np.int32), y.view(np.int32))


@pytest.mark.parametrize("shape", [(64, 50), (3, 4, 5, 5), (17,), (0, 3), ()])
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
def test_each_fast_form_equals_its_slow_form_bit_for_bit(shape: tuple[int, ...], density: float) -> None:
    a, b, mask = _case(shape, seed=len(shape), density=density)
    assert _same_bits(gather(a, mask), a[mask])
    expected = np.zeros(shape, np.float32)
    expected[mask] = a[mask]
    assert _same_bits(scatter(a[mask], mask), expected)
    assert _same_bits(keep(mask, a), np.where(mask, a, 0.0).astype(np.float32))
    assert _same_bits(select(mask, a, b), np.where(mask, a, b).astype(np.float32))


def test_wider_inputs_are_cast_like_the_slow_form_and_bool_scatter_works() -> None:
    a, b, mask = _case((40, 30), seed=3)
    wide = a.astype(np.float64) / 3
    assert _same_bits(keep(mask, wide), np.where(mask, wide, 0.0).astype(np.float32))
    assert _same_bits(select(mask, wide, b), np.where(mask, wide, b).astype(np.float32))
    inner = np.random.default_rng(1).random(int(mask.sum())) < 0.5
    expected = np.zeros(mask.shape, bool)
    expected[mask] = inner
    assert np.array_equal(scatter(inner, mask, bool), expected) and scatter(inner, mask, bool).dtype == bool


def test_mismatched_shapes_and_counts_are_refused() -> None:
    a, b, mask = _case((8, 8), seed=4)
    with pytest.raises(ValueError, match="differs"):
        gather(a, mask[:4])
    with pytest.raises(ValueError, match="values for"):
        scatter(a[mask][:-1], mask)
    with pytest.raises(ValueError, match="differs"):
        keep(mask[:4], a)
    with pytest.raises(ValueError, match="differ"):
        select(mask, a, b[:4])


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "float64"])
def test_tensor_restore_equals_where_and_copy(layout: str) -> None:
    before, trained, mask = _case((48, 32), seed=5)
    tensor, update, torch_mask = torch.from_numpy(before), torch.from_numpy(trained), torch.from_numpy(mask)
    if layout == "transposed":
        tensor, update, torch_mask = tensor.t(), update.t(), torch_mask.t()
    if layout == "float64":
        tensor, update = tensor.double(), update.double()
    original = tensor.clone()
    restore = TensorRestore(torch_mask, tensor)
    tensor.copy_(update)  # what the optimizer step did to it
    expected = torch.where(torch_mask, update, original)
    restore(tensor)
    assert restore.bitwise == (layout == "contiguous")
    bits = torch.int64 if layout == "float64" else torch.int32
    assert torch.equal(tensor.contiguous().view(bits), expected.contiguous().view(bits))
