"""GPFL: the conditional inputs, the valve, the GCE's loss and the whole loss on hand-made tensors; one round's
upload (all but the head), the kept head, and the server's average of the added modules."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from client_app.algorithms.gpfl import HEAD
from common.learning.models import SplitModel
from common.methods.gpfl import (
    ConditionalValve,
    GlobalCategoryEmbedding,
    GPFLModel,
    added_modules,
    class_share,
    conditional_inputs,
    gpfl_loss,
)
from common.seeding import derive_seed

from .inprocess import InProcessFederation


def test_the_conditional_inputs_are_the_plain_and_the_class_weighted_means() -> None:
    embeddings = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    share = class_share(torch.tensor([0, 1, 1, 0]), 3)
    torch.testing.assert_close(share, torch.tensor([0.5, 0.5, 0.0]))
    generic, personal = conditional_inputs(embeddings, share)
    torch.testing.assert_close(generic, torch.tensor([4 / 3, 5 / 3]))
    torch.testing.assert_close(personal, torch.tensor([0.5, 1.0]))


def test_the_valve_scales_and_shifts_then_rectifies() -> None:
    valve = ConditionalValve(2)
    valve.gamma, valve.beta = nn.Identity(), nn.Identity()  # gamma(c) = beta(c) = c
    x, c = torch.tensor([[1.0, -3.0]]), torch.tensor([1.0, 0.5])
    torch.testing.assert_close(valve(x, c), torch.tensor([[3.0, 0.0]]))  # relu(x (c + 1) + c)


def test_the_loss_is_its_four_terms() -> None:
    torch.manual_seed(0)
    added = added_modules(4, 3, seed=1)
    model = GPFLModel(SplitModel(nn.Linear(5, 4), nn.Linear(4, 3)), added).condition(torch.tensor([0.2, 0.3, 0.5]))
    x, y = torch.randn(6, 5), torch.tensor([0, 1, 2, 2, 1, 0])
    features = model.body(x)
    personal = model.head(model.cov(features, model.personal_input))
    generic = model.cov(features, model.global_input)
    embeddings = added.gce.embedding.weight
    cosine = F.normalize(generic) @ F.normalize(embeddings).T
    decay = sum(float((p**2).sum().detach()) for p in [*added.gce.parameters(), *added.cov.parameters()])
    want = (
        F.cross_entropy(personal, y)
        + F.cross_entropy(cosine, y)
        + 0.5 * torch.sqrt(((generic - embeddings[y].detach()) ** 2).sum())
        + 0.5 * 0.2 * decay
    )
    torch.testing.assert_close(gpfl_loss(lam=0.5, mu=0.2)(model, x, y), want)
    torch.testing.assert_close(GlobalCategoryEmbedding(4, 3).loss(generic, y).shape, torch.Size([]))


def _federation() -> InProcessFederation:
    raw = {"algorithm": "gpfl", "dataset": "digits", "num-rounds": 3, "fraction-train": 1.0, "local-epochs": 1}
    return InProcessFederation({**raw, "lr": 0.1, "batch-size": 32}, 2)


def test_all_but_the_head_travels_and_the_added_modules_are_averaged() -> None:
    fed = _federation()
    strategy = fed.strategy
    names = [name for name, _ in strategy.specs]
    assert any(n.startswith("gce.") for n in names) and any(n.startswith("cov.") for n in names)
    assert strategy.shared == [n for n in names if not n.startswith("head.")]
    index = names.index("gce.embedding.weight")
    seeded = added_modules(128, 10, derive_seed(fed.cfg.seed, "gpfl-modules"))  # what every client builds
    np.testing.assert_array_equal(strategy.global_arrays[index], seeded.gce.embedding.weight.detach().numpy())
    sent = fed.train_round(1)
    counts = {pid: int(r.metric_records["metrics"]["num-examples"]) for pid, r in sent.items()}
    uploads = {pid: r.array_records["arrays"] for pid, r in sent.items()}
    assert all(set(u.keys()) == set(strategy.shared) for u in uploads.values())
    mean = sum(counts[p] * uploads[p]["gce.embedding.weight"].numpy().astype(np.float64) for p in uploads)
    np.testing.assert_allclose(strategy.global_arrays[index], mean / sum(counts.values()), rtol=1e-5, atol=1e-6)
    head = fed.client(0).env.state.load_arrays(HEAD)
    assert head is not None and [a.shape for a in head] == [(10, 128), (10,)]
    metrics = fed.evaluate(1)[0].metric_records["metrics"]
    assert np.isfinite(float(metrics["acc-shift-0"]))
