"""pFedMe: K inner steps and the outer step on a toy model against hand-derived updates, one round's upload, kept
personal model and server step against Algorithm 1, and the settings it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from client_app.algorithms.pfedme import PERSONAL
from common.config import ConfigError, parse_run_config
from common.learning.train import TrainSettings, train
from common.methods.pfedme import MoreauEnvelope

from .inprocess import InProcessFederation


def test_inner_and_outer_steps_are_algorithm_ones() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    theta = nn.Linear(3, 2)
    lam, personal_lr, lr, k = 2.0, 0.1, 0.05, 3
    w = {name: p.detach().clone() for name, p in theta.named_parameters()}
    t = {name: p.detach().clone() for name, p in theta.named_parameters()}
    for _ in range(k):  # theta <- theta - p (grad f(theta) + lambda (theta - w)), w fixed
        live = {name: v.clone().requires_grad_(True) for name, v in t.items()}
        loss = F.cross_entropy(F.linear(x, live["weight"], live["bias"]), y)
        grads = dict(zip(live, torch.autograd.grad(loss, list(live.values()))))
        t = {name: t[name] - personal_lr * (grads[name] + lam * (t[name] - w[name])) for name in t}
    w = {name: w[name] - lr * lam * (w[name] - t[name]) for name in w}  # then w <- w - eta lambda (w - theta)
    envelope = MoreauEnvelope(theta, lam, lr)
    settings = TrainSettings(epochs=1, batch_size=4, lr=personal_lr, steps_per_batch=k)  # one mini-batch
    generator = torch.Generator().manual_seed(0)
    stats = train(theta, x, y, settings, generator, extra_losses=[envelope.term], after_batch=envelope.outer_step)
    assert stats.steps == k
    for name, param in theta.named_parameters():
        torch.testing.assert_close(param.detach(), t[name])
        torch.testing.assert_close(envelope.local_state()[name], w[name])


def _federation(**overrides) -> InProcessFederation:
    raw = {"algorithm": "pfedme", "dataset": "digits", "num-rounds": 3, "fraction-train": 1.0, "local-epochs": 1}
    return InProcessFederation({**raw, "lr": 0.05, "batch-size": 32, **overrides}, 2)


def test_a_round_uploads_w_keeps_theta_and_moves_the_global_model_by_beta() -> None:
    fed = _federation(**{"pfedme-beta": 0.5, "pfedme-k": 2})
    start = [a.copy() for a in fed.strategy.global_arrays]
    names = [name for name, _ in fed.strategy.specs]
    replies = fed.train_round(1)
    uploads, counts = {}, {}
    for pid, reply in replies.items():
        metrics = reply.metric_records["metrics"]
        counts[pid] = int(metrics["num-examples"])
        assert int(metrics["steps"]) == 2 * -(-counts[pid] // 32)  # K steps per mini-batch
        uploads[pid] = [reply.array_records["arrays"][n].numpy() for n in names]
        theta = fed.client(pid).env.state.load_arrays(PERSONAL)
        assert theta is not None and not all(np.allclose(a, b) for a, b in zip(theta, uploads[pid]))
    total = sum(counts.values())
    for i in range(len(names)):  # w <- (1 - beta) w + beta (sample-weighted average of the w_i)
        mean = sum(counts[p] * uploads[p][i].astype(np.float64) for p in uploads) / total
        np.testing.assert_allclose(fed.strategy.global_arrays[i], 0.5 * start[i] + 0.5 * mean, atol=1e-6)
    metrics = fed.evaluate(1)[0].metric_records["metrics"]  # theta is evaluated, the received model is its row
    assert float(metrics["acc-shift-0"]) != float(metrics["global-acc-shift-0"])


def test_settings_that_diverge_are_refused() -> None:
    with pytest.raises(ConfigError, match="inner SGD steps"):
        parse_run_config({"algorithm": "pfedme", "pfedme-personal-lr": 0.2, "pfedme-lambda": 15})
    with pytest.raises(ConfigError, match="outer step"):
        parse_run_config({"algorithm": "pfedme", "lr": 0.2, "pfedme-lambda": 15})
    with pytest.raises(ConfigError, match="pfedme-k"):
        parse_run_config({"algorithm": "pfedme", "pfedme-k": 0})
    with pytest.raises(ConfigError, match="pfedme-beta"):
        parse_run_config({"algorithm": "pfedme", "pfedme-beta": 3})
