"""Gradient inversion by an honest-but-curious server, run on what one client sent in one round.

The server knows the model the round started from, the client's learning rate and number of local steps, and
which coordinates the upload carries (dense, a sparse mask, or the shared layers only). It does not know the
client's data.

- iDLG labels: Zhao et al., "iDLG: Improved Deep Leakage from Gradients", 2020, arXiv:2001.02610. The classifier
  bias's update is negative exactly at the labels present in the batch.
- DLG: Zhu et al., "Deep Leakage from Gradients", NeurIPS 2019, arXiv:1906.08935. Squared distance between the
  observed and a simulated update, L-BFGS on the dummy images.
- Inverting Gradients: Geiping et al., "Inverting Gradients - How easy is it to break privacy in federated
  learning?", NeurIPS 2020, arXiv:2003.14053. Cosine distance plus total variation, Adam, with the pixel range
  enforced.

For several local steps, the attack simulates the client's steps on the dummy batch (full-batch SGD with the
client's learning rate, Geiping et al. section 5) and matches the resulting update.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

Params = dict[str, torch.Tensor]
Masks = Mapping[
    str, torch.Tensor | None
]  # per parameter: the boolean mask of coordinates sent; None: all; absent: none


def local_update(
    model: nn.Module,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float,
    steps: int,
    trainable: Masks | None = None,
) -> Params:
    """The update (new - old parameters) of `steps` full-batch SGD steps of cross-entropy on (x, y) from `params`,
    differentiable with respect to x (what the client computes, and what the attack simulates). `trainable`: per
    parameter the positions that train (a sparse network: the others stay as they are; None: every one)."""
    start = {
        name: value if value.requires_grad else value.detach().requires_grad_(True) for name, value in params.items()
    }
    current = dict(start)
    for _ in range(steps):
        loss = nn.functional.cross_entropy(functional_call(model, current, (x,)), y)
        grads = torch.autograd.grad(loss, list(current.values()), create_graph=True)
        if trainable is not None:
            grads = tuple(g if (m := trainable.get(n)) is None else g * m for n, g in zip(current, grads))
        current = {name: value - lr * grad for (name, value), grad in zip(current.items(), grads)}
    return {name: current[name] - start[name] for name in params}


def observed(update: Params, masks: Masks) -> Params:
    """What the server sees of an update: each parameter's coordinates on its mask (every one where the mask is
    None); parameters without an entry in `masks` are not sent."""
    return {
        name: value if masks[name] is None else value[masks[name]] for name, value in update.items() if name in masks
    }


def idlg_labels(bias_update: torch.Tensor, batch: int) -> torch.Tensor:
    """The labels of a batch read from the classifier bias's update: under SGD the update is -lr * mean(p - onehot),
    positive exactly where a label is present. For batch 1, the one largest entry; for more, the `batch` largest,
    which holds when the labels are distinct (repeated labels need a count, which the attack does not guess); a
    batch larger than the classes takes them all, then again from the largest, until it is full."""
    order = torch.argsort(bias_update.detach(), descending=True)
    return order[torch.arange(batch) % len(order)].sort().values


def label_counts(bias_update: torch.Tensor, lr: float, steps: int, total: int) -> torch.Tensor:
    """The labels of a sum's `total` images read as counts from the classifier bias's mean update: under SGD it is
    lr * (mean(onehot) - mean(p)) a step, so the label shares are mean(p) + update / (lr * steps), with mean(p) taken
    as uniform (the predictions of a model near its start); the shares rounded to `total` labels by largest
    remainder. Repeated labels, which `idlg_labels` cannot place, are counted (exact for one step of a model whose
    mean prediction is uniform)."""
    classes = bias_update.numel()
    share = (1.0 / classes + bias_update.detach().double() / (lr * steps)).clamp(min=0.0)
    if float(share.sum()) <= 0:
        share = torch.ones(classes, dtype=torch.float64)
    expected = share / share.sum() * total
    counts = expected.floor().long()
    left = total - int(counts.sum())
    if left > 0:
        counts[torch.argsort(expected - counts, descending=True)[:left]] += 1
    return torch.repeat_interleave(torch.arange(classes), counts).sort().values


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Anisotropic total variation of a batch of images (N, C, H, W), mean over pixels."""
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., :, 1:] - x[..., :, :-1]).abs().mean()


@dataclass(frozen=True)
class KnownRound:
    """What the server knows of the client's round besides the model: its learning rate and local steps, and the
    range of the data's normalized pixels."""

    lr: float
    steps: int
    bounds: tuple[float, float]


@dataclass(frozen=True)
class Attack:
    """One attack's settings: `method` "dlg" (L-BFGS, squared distance) or "ig" (Adam, cosine distance + total
    variation), its iterations, step size and TV weight."""

    method: str = "ig"
    iterations: int = 300
    step: float = 0.1
    tv_weight: float = 1e-4


def _distance(simulated: Params, target: Params, method: str) -> torch.Tensor:
    """The matching loss over what the server observed: the squared distance over the target's squared norm (DLG,
    scale-free, so one stopping rule serves a dense update and a 1% sparse one alike) or 1 - cosine similarity
    (IG, scale-free already)."""
    a = torch.cat([v.reshape(-1) for v in simulated.values()])
    b = torch.cat([v.reshape(-1) for v in target.values()])
    if method == "dlg":
        return ((a - b) ** 2).sum() / (b**2).sum().clamp_min(1e-30)
    return 1 - nn.functional.cosine_similarity(a, b, dim=0, eps=1e-12)


DLG_TOLERANCE_GRAD = 1e-9  # L-BFGS stops when its gradient's largest entry is below this (on the scale-free loss)
DLG_TOLERANCE_CHANGE = 1e-12  # or when a step changes the loss or the images by less than this
MOVED = 0.99  # an attack whose final matching loss is not below this share of its start's did not move


@dataclass(frozen=True)
class Trace:
    """How an inversion ran: the stopping rule it followed, the iterations it took, its matching loss at the seeded
    start and at the end, and whether it moved from its start (a reconstruction that did not is never scored)."""

    rule: str
    iterations: int
    start_loss: float
    final_loss: float

    @property
    def moved(self) -> bool:
        """Whether the matching loss fell below MOVED of its start."""
        return self.final_loss < MOVED * self.start_loss


def invert(
    model: nn.Module,
    params: Params,
    target: Params,
    masks: Masks,
    labels: torch.Tensor,
    shape: tuple[int, ...],
    known: KnownRound,
    attack: Attack,
    seed: int,
    trainable: Masks | None = None,
) -> tuple[torch.Tensor, Trace]:
    """The images the attack reconstructs from the observed update `target` (what `observed` returns), for the
    given labels and image shape (N, C, H, W), pixel values kept within the known bounds; and how it ran (Trace).
    DLG: L-BFGS with a strong-Wolfe line search on the scale-free loss until DLG_TOLERANCE_GRAD /
    DLG_TOLERANCE_CHANGE or `iterations` steps; IG: `iterations` signed Adam steps. `trainable`: the positions
    the client trained (a sparse client's mask), which the simulated steps train too."""
    lr, steps, bounds = known.lr, known.steps, known.bounds
    generator = torch.Generator().manual_seed(seed)
    dummy = torch.randn(shape, generator=generator).clamp(*bounds).requires_grad_(True)
    frozen = {name: value.detach() for name, value in params.items()}

    def matching() -> torch.Tensor:
        simulated = observed(local_update(model, frozen, dummy, labels, lr, steps, trainable), masks)
        return _distance(simulated, target, attack.method)

    def loss() -> torch.Tensor:
        value = matching()
        return value + attack.tv_weight * total_variation(dummy) if attack.method == "ig" else value

    start = float(matching().detach())
    if attack.method == "dlg":
        lbfgs = torch.optim.LBFGS(
            [dummy],
            lr=attack.step,
            max_iter=attack.iterations,
            tolerance_grad=DLG_TOLERANCE_GRAD,
            tolerance_change=DLG_TOLERANCE_CHANGE,
            history_size=100,
            line_search_fn="strong_wolfe",
        )

        def closure() -> float:
            lbfgs.zero_grad()
            value = loss()
            value.backward()
            return float(value.detach())

        lbfgs.step(closure)
        iterations = int(lbfgs.state[dummy].get("n_iter", 0)) if dummy in lbfgs.state else 0
        rule = (
            f"L-BFGS (strong Wolfe) to gradient {DLG_TOLERANCE_GRAD:g} or change {DLG_TOLERANCE_CHANGE:g} of the "
            f"scale-free loss, at most {attack.iterations} iterations"
        )
        with torch.no_grad():
            dummy.clamp_(*bounds)
    elif attack.method == "ig":
        adam = torch.optim.Adam([dummy], lr=attack.step)
        for _ in range(attack.iterations):
            adam.zero_grad()
            loss().backward()
            assert dummy.grad is not None
            dummy.grad.sign_()  # signed gradients, as Geiping et al. use
            adam.step()
            with torch.no_grad():
                dummy.clamp_(*bounds)
        iterations, rule = attack.iterations, f"{attack.iterations} signed Adam steps"
    else:
        raise ValueError(f"unknown attack {attack.method!r}: 'dlg' or 'ig'")
    final = float(matching().detach())
    return dummy.detach().clamp(*bounds), Trace(rule, iterations, start, final)
