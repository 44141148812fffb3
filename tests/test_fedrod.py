"""FedRoD: the balanced softmax on hand-made logits, each head's gradient from its own loss only, one round's
upload independent of the personalized head, and the head kept on the device."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from client_app.algorithms.fedrod import PERSONAL_HEAD
from common.learning.models import SplitModel
from common.methods.fedrod import RoDModel, balanced_softmax_loss, rod_loss

from .inprocess import InProcessFederation


def test_the_balanced_softmax_adds_log_class_counts() -> None:
    logits, counts = torch.zeros(2, 2), torch.tensor([3, 1])
    loss = balanced_softmax_loss(logits, torch.tensor([0, 1]), counts)
    torch.testing.assert_close(loss, torch.tensor((-math.log(3 / 4) - math.log(1 / 4)) / 2))
    live = torch.zeros(1, 3, requires_grad=True)  # a class the client has none of: no probability, no gradient
    missing = balanced_softmax_loss(live, torch.tensor([0]), torch.tensor([2, 0, 1]))
    missing.backward()
    assert live.grad is not None
    assert torch.isfinite(missing) and torch.all(torch.isfinite(live.grad)) and live.grad[0, 1] == 0


def _rod() -> RoDModel:
    torch.manual_seed(0)
    return RoDModel(SplitModel(nn.Sequential(nn.Linear(4, 3), nn.ReLU()), nn.Linear(3, 2)), nn.Linear(3, 2))


def test_each_head_gets_the_gradient_of_its_own_loss() -> None:
    model, x, y, counts = _rod(), torch.randn(5, 4), torch.tensor([0, 1, 1, 0, 1]), torch.tensor([4, 6])
    rod_loss(counts)(model, x, y).backward()
    generic_params = list(model.generic.parameters())
    expected = torch.autograd.grad(balanced_softmax_loss(model.generic(x), y, counts), generic_params)
    for param, want in zip(generic_params, expected):
        torch.testing.assert_close(param.grad, want)
    features = model.generic.body(x).detach()
    personal = model.generic.head(features).detach() + model.personal_head(features)
    want_head = torch.autograd.grad(F.cross_entropy(personal, y), list(model.personal_head.parameters()))
    for param, want in zip(model.personal_head.parameters(), want_head):
        torch.testing.assert_close(param.grad, want)
    torch.testing.assert_close(model(x), model.generic(x) + model.personal_head(model.generic.body(x)))


def _federation() -> InProcessFederation:
    raw = {"algorithm": "fedrod", "dataset": "digits", "num-rounds": 3, "fraction-train": 1.0, "local-epochs": 1}
    return InProcessFederation({**raw, "lr": 0.1, "batch-size": 32}, 2)


def test_the_upload_is_the_generic_model_alone_and_the_head_stays() -> None:
    fed = _federation()
    names = [name for name, _ in fed.strategy.specs]
    first = fed.train_round(1)
    head = fed.client(0).env.state.load_arrays(PERSONAL_HEAD)
    assert head is not None and len(head) == 2  # the head's weight and bias, on the device only
    assert set(first[0].array_records["arrays"].keys()) == set(names)
    # round 1's message again, on two devices whose personalized heads differ: the same generic model comes back
    content = fed.sent[1][0]
    kept, zeroed = fed.client(0), fed.client(0)
    zeroed.env.state.save_arrays(PERSONAL_HEAD, [np.zeros_like(a) for a in head])
    uploads = [client.fit(1, content).array_records["arrays"] for client in (kept, zeroed)]
    heads = [client.env.state.load_arrays(PERSONAL_HEAD) for client in (kept, zeroed)]
    for name in names:
        np.testing.assert_array_equal(uploads[0][name].numpy(), uploads[1][name].numpy())
        np.testing.assert_array_equal(uploads[0][name].numpy(), first[0].array_records["arrays"][name].numpy())
    assert heads[0] is not None and heads[1] is not None and not np.array_equal(heads[0][0], heads[1][0])
    metrics = fed.evaluate(1)[0].metric_records["metrics"]
    assert "global-acc-shift-0" in metrics and np.isfinite(float(metrics["acc-shift-0"]))
