"""Training FLOPs: counted by torch's FLOP counter, scaled per layer by mask density."""

from __future__ import annotations

import pytest

from common.learning.flops import flops_per_sample, training_flops
from common.learning.models import build_model


def test_dense_mlp_flops_by_hand() -> None:
    model = build_model("mlp", "digits", (1, 8, 8), 10, seed=0)
    # forward 2*(64*128 + 128*10) multiply-adds; backward twice that, except no input grad for layer 1
    forward = 2 * (64 * 128 + 128 * 10)
    backward = 2 * (2 * 128 * 10) + 2 * (64 * 128)
    assert flops_per_sample(model, (1, 8, 8), 10) == pytest.approx(forward + backward)


def test_density_scales_only_that_layer() -> None:
    model = build_model("cnn-mnist", "mnist", (1, 28, 28), 10, seed=0)
    dense = flops_per_sample(model, (1, 28, 28), 10)
    half_conv2 = flops_per_sample(model, (1, 28, 28), 10, {"body.3.weight": 0.5})
    zero_conv2 = flops_per_sample(model, (1, 28, 28), 10, {"body.3.weight": 0.0})
    assert dense - half_conv2 == pytest.approx((dense - zero_conv2) / 2)
    assert 0.5 * dense < half_conv2 < dense
    assert training_flops(dense, 100, 5) == pytest.approx(500 * dense)
