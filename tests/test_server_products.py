"""Where FedAMP's server products run: the server's GPU when it has one (and the run does not ask for the CPU), else
numpy on the CPU; the same models either way, to rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import common.methods.attention as attention
from server_app.strategies.client_models import products_device

from .inprocess import InProcessFederation


@pytest.mark.parametrize(
    ("run_device", "has_gpu", "expected"),
    [("cpu", True, None), ("auto", False, None), ("auto", True, "cuda"), ("cuda", True, "cuda"), ("cuda", False, None)],
)
def test_the_server_uses_its_gpu_only_when_it_has_one(monkeypatch, run_device: str, has_gpu: bool, expected) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: has_gpu)
    assert products_device(run_device) == expected


def _fedamp(device: str | None) -> InProcessFederation:
    raw = {"algorithm": "fedamp", "dataset": "digits", "num-rounds": 2, "fraction-train": 1.0, "lr": 0.1}
    fed = InProcessFederation(raw, 4)
    fed.strategy.products_device = device
    for rnd in (1, 2):
        fed.train_round(rnd)
    return fed


def test_fedamp_on_a_torch_device_trains_the_same_models_to_rounding(monkeypatch) -> None:
    """The torch path (on the CPU here, as on a GPU) computes the Gram rows and cloud models of a real run: the
    models the clients trained from them match numpy's run to rounding."""
    moved: list[str] = []
    to_torch = attention._on_device
    monkeypatch.setattr(attention, "_on_device", lambda a, device, *d: moved.append(device) or to_torch(a, device, *d))
    on_numpy = _fedamp(None)
    assert moved == []
    on_torch = _fedamp("cpu")
    assert moved and set(moved) == {"cpu"}
    assert on_torch.strategy.matrix.heard.all()
    np.testing.assert_allclose(on_torch.strategy.matrix.W, on_numpy.strategy.matrix.W, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(on_torch.strategy.matrix.G, on_numpy.strategy.matrix.G, rtol=1e-4)
