"""FedCP: the seeded Gumbel-softmax, the MMD, the policy's split and the loss on hand-made tensors; one round's upload
(the body, the policy, the mean of the personal and the global head), the kept personal head, the frozen parts, and
the server's average."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from client_app.algorithms.fedcp import HEAD
from common.config import ConfigError
from common.learning.models import ModelLayout, SplitModel
from common.methods.fedcp import FedCPModel, added_modules, fedcp_loss, gumbel_softmax, mmd_rbf
from common.seeding import derive_seed
from server_app.strategies.fedcp import FedCPStrategy

from .inprocess import InProcessFederation


def test_the_gumbel_softmax_is_seeded_and_matches_its_formula() -> None:
    logits = torch.tensor([[0.0, 1.0], [2.0, -1.0]])
    first = gumbel_softmax(logits, 0.5, torch.Generator().manual_seed(7), dim=1)
    again = gumbel_softmax(logits, 0.5, torch.Generator().manual_seed(7), dim=1)
    torch.testing.assert_close(first, again)
    gumbels = -torch.empty(2, 2).exponential_(generator=torch.Generator().manual_seed(7)).log()
    torch.testing.assert_close(first, F.softmax((logits + gumbels) / 0.5, dim=1))
    torch.testing.assert_close(first.sum(dim=1), torch.ones(2))


def test_the_mmd_by_hand() -> None:
    x, y = torch.tensor([[0.0], [2.0]], dtype=torch.float64), torch.tensor([[1.0], [1.0]], dtype=torch.float64)
    # squared distances: xx = [[0, 4], [4, 0]], yy = 0 everywhere, xy = 1 everywhere
    want = 0.0
    for a in (10.0, 15.0, 20.0, 50.0):
        kxx = (2 * 1.0 + 2 * math.exp(-2.0 / a)) / 4
        want += kxx + 1.0 - 2.0 * math.exp(-0.5 / a)
    assert float(mmd_rbf(x, y)) == pytest.approx(want, rel=1e-12)
    assert float(mmd_rbf(x, x)) == pytest.approx(0.0, abs=1e-6)


def _model(seed: int = 0) -> FedCPModel:
    torch.manual_seed(seed)
    split = SplitModel(nn.Sequential(nn.Linear(5, 4), nn.ReLU()), nn.Linear(4, 3))
    model = FedCPModel(split, added_modules(4, seed=1), tau=1.0, noise=torch.Generator().manual_seed(3))
    with torch.no_grad():
        model.head.weight.mul_(-2.0)  # the global head differs from the personal one
    return model.set_context()


def test_the_split_and_the_logits_follow_the_policy() -> None:
    model = _model()
    x = torch.randn(6, 5)
    features = model.body(x)
    weight = model.personal.weight.detach()
    context = weight.sum(dim=0, keepdim=True) / weight.sum(dim=0).norm()
    logits = model.cs.fc(features * context).view(6, 2, 4)
    shares = gumbel_softmax(logits, 1.0, torch.Generator().manual_seed(3), dim=1)
    want = model.personal(features * shares[:, 0]) + model.head(features * shares[:, 1])
    torch.testing.assert_close(model(x), want)


def test_the_loss_is_the_cross_entropy_plus_lambda_times_the_mmd() -> None:
    model = _model()
    with torch.no_grad():
        model.body[0].weight.add_(0.3)  # trained away from the received extractor
    x, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 2, 1, 0])
    noise_state = model.noise.get_state()
    logits = model(x)
    model.noise.set_state(noise_state)
    want = F.cross_entropy(logits, y) + 2.0 * mmd_rbf(model.body(x), model.received_body(x))
    torch.testing.assert_close(fedcp_loss(lam=2.0)(model, x, y), want)
    assert model.frozen() == {"head.weight", "head.bias", "received_body.0.weight", "received_body.0.bias"}


def _federation(**extra: object) -> InProcessFederation:
    raw = {"algorithm": "fedcp", "dataset": "digits", "num-rounds": 3, "fraction-train": 1.0, "local-epochs": 1}
    return InProcessFederation({**raw, "lr": 0.1, "batch-size": 32, **extra}, 2)


def test_the_upload_mixes_the_heads_and_the_personal_head_stays() -> None:
    fed = _federation()
    strategy = fed.strategy
    names = [name for name, _ in strategy.specs]
    assert strategy.shared == names and any(n.startswith("cs.") for n in names)
    index = {name: i for i, name in enumerate(names)}
    seeded = added_modules(128, derive_seed(fed.cfg.seed, "fedcp-modules"))  # what every client builds
    np.testing.assert_array_equal(strategy.global_arrays[index["cs.fc.0.weight"]], seeded.cs.fc[0].weight.detach())
    sent_head = strategy.global_arrays[index["head.weight"]].copy()
    first_body = next(name for name in names if name.startswith("body."))
    sent_body = strategy.global_arrays[index[first_body]].copy()
    replies = fed.train_round(1)
    counts = {pid: int(r.metric_records["metrics"]["num-examples"]) for pid, r in replies.items()}
    uploads = {pid: r.array_records["arrays"] for pid, r in replies.items()}
    for pid, upload in uploads.items():
        assert list(upload.keys()) == names
        personal = fed.client(pid).env.state.load_arrays(HEAD)
        assert personal is not None and [a.shape for a in personal] == [(10, 128), (10,)]
        assert not np.allclose(personal[0], sent_head)  # the personal head trained
        # the global head does not train: the upload is the mean of the personal head and the one received
        np.testing.assert_allclose(upload["head.weight"].numpy(), 0.5 * personal[0] + 0.5 * sent_head, atol=1e-6)
    mean = sum(counts[p] * uploads[p]["cs.fc.0.weight"].numpy().astype(np.float64) for p in uploads)
    np.testing.assert_allclose(
        strategy.global_arrays[index["cs.fc.0.weight"]], mean / sum(counts.values()), rtol=1e-5, atol=1e-6
    )
    assert not np.allclose(strategy.global_arrays[index[first_body]], sent_body)
    first = fed.evaluate(1)[0].metric_records["metrics"]
    again = fed.evaluate(1)[0].metric_records["metrics"]
    assert np.isfinite(float(first["acc-shift-0"])) and first["acc-shift-0"] == again["acc-shift-0"]


def test_a_model_without_a_linear_head_is_refused() -> None:
    fed = _federation()
    two_layer_head = SplitModel(nn.Linear(5, 4), nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 3)))
    with pytest.raises(ConfigError, match="fedcp cannot add its modules: the model's head is not one linear layer"):
        FedCPStrategy(fed.cfg, ModelLayout.of(two_layer_head), fed.clients)
