"""The shared training loop: proximal gradient, frozen masked weights, trainable subsets, determinism."""

from __future__ import annotations

import torch

from common.models import mlp
from common.train import LossContext, TrainSettings, proximal_loss, train

X = torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 10, (64,), generator=torch.Generator().manual_seed(1))


def _model(seed: int = 0):
    torch.manual_seed(seed)
    return mlp((1, 8, 8), 10)


def test_proximal_gradient_is_mu_times_distance() -> None:
    model = _model()
    reference = {name: p.detach() + 0.5 * torch.randn_like(p) for name, p in model.named_parameters()}
    mu = 0.3
    term = proximal_loss(reference, mu)
    logits = model(X)
    loss = term(LossContext(model, X, Y, logits, logits))
    loss.backward()
    for name, p in model.named_parameters():
        expected = mu * (p.detach() - reference[name])
        assert torch.allclose(p.grad, expected, atol=1e-6), name
    zero = proximal_loss({n: p.detach() for n, p in model.named_parameters()}, mu)
    assert float(zero(LossContext(model, X, Y, logits, logits)).detach()) == 0.0


def test_proximal_term_changes_training() -> None:
    settings = TrainSettings(epochs=2, batch_size=16, lr=0.1)
    plain, prox = _model(), _model()
    anchor = {n: p.detach().clone() for n, p in prox.named_parameters()}
    train(plain, X, Y, settings, torch.Generator().manual_seed(0))
    train(prox, X, Y, settings, torch.Generator().manual_seed(0), extra_losses=[proximal_loss(anchor, 5.0)])
    drift_plain = sum((p.detach() - anchor[n]).norm() for n, p in plain.named_parameters())
    drift_prox = sum((p.detach() - anchor[n]).norm() for n, p in prox.named_parameters())
    assert drift_prox < 0.8 * drift_plain


def test_masked_weights_never_change_even_with_momentum_and_decay() -> None:
    model = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    masks = {n: torch.rand_like(p) < 0.5 for n, p in model.named_parameters()}
    settings = TrainSettings(epochs=3, batch_size=8, lr=0.1, momentum=0.9, weight_decay=0.01)
    train(model, X, Y, settings, torch.Generator().manual_seed(0), update_masks=masks)
    for n, p in model.named_parameters():
        frozen = ~masks[n]
        assert torch.equal(p.detach()[frozen], before[n][frozen]), f"{n}: a masked weight moved"
        assert not torch.equal(p.detach()[masks[n]], before[n][masks[n]]), f"{n}: nothing trained"


def test_trainable_subset_only() -> None:
    model = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    head = {n for n in before if n.startswith("head.")}
    train(model, X, Y, TrainSettings(epochs=1, batch_size=16), torch.Generator().manual_seed(0), trainable=head)
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), before[n]) == (n not in head), n
    assert all(p.requires_grad for p in model.parameters()), "requires_grad restored"


def test_same_generator_same_result() -> None:
    a, b = _model(), _model()
    settings = TrainSettings(epochs=2, batch_size=10, lr=0.05, momentum=0.9)
    sa = train(a, X, Y, settings, torch.Generator().manual_seed(5))
    sb = train(b, X, Y, settings, torch.Generator().manual_seed(5))
    assert sa.mean_loss == sb.mean_loss and sa.steps == 14
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
