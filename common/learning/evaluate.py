"""The one evaluation loop: logits, loss, accuracy, accuracy at every test-time shift degree, under each corruption
and on every domain."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from common import profiling
from common.data.domains import DOMAINS
from common.data.federated import ClientData
from common.data.shift import shifted_correct
from common.sections import EvaluationSettings

# Rows per forward pass. On a CPU, images go in batches of 128: a convolution's output for 512 images (cnn-mnist's
# first: 51 MB) overflows the caches, and 128 at a time took 18-45% less time (cnn-mnist, cnn-cifar, resnet10-s, one
# thread), with logits equal bit for bit to 512's for the models without batch norm (measured on each model).
CPU_IMAGE_BATCH, BATCH = 128, 512


def eval_batch_size(x: torch.Tensor, device: torch.device | str) -> int:
    """Rows per forward pass of the evaluation loop for these inputs on this device."""
    return CPU_IMAGE_BATCH if x.dim() == 4 and torch.device(device).type == "cpu" else BATCH


@torch.no_grad()
def predict_logits(
    model: nn.Module, x: torch.Tensor, batch_size: int | None = None, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Logits of `model` on `x`, batched (by default `eval_batch_size`), on the CPU."""
    model.to(device).eval()
    if len(x) == 0:
        return torch.empty(0)
    batch_size = batch_size or eval_batch_size(x, device)
    outs = [model(x[i : i + batch_size].to(device)).float().cpu() for i in range(0, len(x), batch_size)]
    return torch.cat(outs)


class MemoLogits(nn.Module):
    """A model that remembers its logits per input batch for its lifetime (one evaluation), so rows that run the
    same model on the same sets (DM-PFL's theta_c, theta_g and their adaptive mix) pay one forward pass each."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.memo: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The wrapped model's logits on x, computed once per batch (the batch is kept, so its memory cannot be
        reused by another tensor while the memo holds its key)."""
        key = (x.data_ptr(), int(x.storage_offset()), tuple(x.shape), tuple(x.stride()))
        hit = self.memo.get(key)
        if hit is not None and torch.equal(hit[0], x):
            return hit[1]
        logits = self.model(x)
        self.memo[key] = (x, logits)
        return logits


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of each row of a probability matrix."""
    return -(probs * probs.clamp_min(1e-12).log()).sum(dim=1)


@dataclass(frozen=True)
class EvalResult:
    """A model's results on one client's test data."""

    num_test: int
    loss: float
    accuracy: float
    shift_accuracy: dict[float, float]
    extra: dict[str, float] = field(default_factory=dict)  # corruption and domain accuracies, by metric key


def shift_key(degree: float) -> str:
    """Metric name of the accuracy at a shift degree, e.g. 'acc-shift-0.4'."""
    return f"acc-shift-{degree:g}"


def corruption_key(name: str, severity: int) -> str:
    """Metric name of the accuracy under a corruption at a severity, e.g. 'acc-corrupt-gaussian_noise-3'."""
    return f"acc-corrupt-{name}-{severity}"


def domain_accuracy_key(name: str) -> str:
    """Metric name of the evaluated model's accuracy on one domain's held-out test data, e.g. 'acc-domain-usps'."""
    return f"acc-domain-{name}"


SEEN_DOMAIN_KEY = "acc-seen-domain"  # on the held-out data of the domain the client trained on
UNSEEN_DOMAINS_KEY = "acc-unseen-domains"  # mean over the domains it never trained on


def shifted_metric_keys(evaluation: EvaluationSettings) -> tuple[str, ...]:
    """The accuracies every evaluation reply of the run carries beyond the shift degrees: each corruption at each
    severity, and with the `domains` partition every domain's, the seen domain's and the unseen domains' mean."""
    keys = [corruption_key(name, s) for name in evaluation.corruptions for s in evaluation.corruption_severities]
    if evaluation.domains:
        keys += [domain_accuracy_key(name) for name in DOMAINS] + [SEEN_DOMAIN_KEY, UNSEEN_DOMAINS_KEY]
    return tuple(keys)


def domain_summary(accuracies: Sequence[tuple[str, float]], own: int) -> dict[str, float]:
    """Per-domain accuracies as metrics, with the seen domain's (index `own`) and the mean over the others."""
    out = {domain_accuracy_key(name): acc for name, acc in accuracies}
    if 0 <= own < len(accuracies):
        unseen = [acc for d, (_, acc) in enumerate(accuracies) if d != own]
        out[SEEN_DOMAIN_KEY] = accuracies[own][1]
        out[UNSEEN_DOMAINS_KEY] = float(sum(unseen) / len(unseen)) if unseen else float("nan")
    return out


def shift_accuracy(
    predict: Callable[[torch.Tensor], torch.Tensor], data: ClientData, degrees: tuple[float, ...]
) -> dict[float, float]:
    """Accuracy of any label predictor at each shift degree (one pass over the test set, one over the draws)."""
    if len(data.test_y) == 0:
        return {d: float("nan") for d in degrees}
    own_correct = (predict(data.test_x) == data.test_y).numpy()
    needs_draws = any(d > 0 for d in degrees)
    draw_correct = (predict(data.shift_x) == data.shift_y).numpy() if needs_draws else own_correct
    return shifted_correct(data.shift_plan, own_correct, draw_correct, degrees)


def test_logits(
    model: nn.Module, data: ClientData, degrees: tuple[float, ...], device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A model's logits on the client's test inputs and on its shift draws (None when no degree needs them), in
    one pass over both: fewer, fuller batches (a client's test set is often smaller than one), and the same
    tensor for every model evaluated, so MemoLogits' memo still hits."""
    draws = any(d > 0 for d in degrees) and len(data.shift_x) > 0 and data.shift_x is not data.test_x
    both = predict_logits(model, data.test_and_draws if draws else data.test_x, device=device)
    num_test = len(data.test_y)
    return both[:num_test], (both[num_test:] if draws else None)


def shifted_share(
    data: ClientData, degrees: tuple[float, ...], own: np.ndarray, draws: np.ndarray | None
) -> dict[float, float]:
    """The share of samples where a per-sample indicator holds, at each shift degree (as accuracy is: `own` on the
    test set, `draws` on the shift draws)."""
    return shifted_correct(data.shift_plan, own, own if draws is None else draws, degrees)


@profiling.timed("evaluate")
def evaluate_client(
    model: nn.Module,
    data: ClientData,
    degrees: tuple[float, ...],
    device: torch.device | str = "cpu",
    corrupted: Mapping[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
    domains: Sequence[tuple[str, torch.Tensor, torch.Tensor]] = (),
) -> EvalResult:
    """Loss and accuracy on the client's own test set, accuracy at each shift degree, on each `corrupted` copy of
    the test set (metric key -> inputs, labels) and on each domain's (name, inputs, labels) held-out data."""
    num_test = len(data.test_y)
    if num_test == 0:
        return EvalResult(0, float("nan"), float("nan"), {d: float("nan") for d in degrees})
    logits, draw_logits = test_logits(model, data, degrees, device)
    cached = {id(data.test_x): logits}
    if draw_logits is not None:
        cached[id(data.shift_x)] = draw_logits

    def predict(x: torch.Tensor) -> torch.Tensor:
        out = cached.get(id(x))
        return (out if out is not None else predict_logits(model, x, device=device)).argmax(1)

    accuracies = shift_accuracy(predict, data, degrees)

    def hit_rate(x: torch.Tensor, y: torch.Tensor) -> float:
        return float((predict(x) == y).float().mean()) if len(y) else float("nan")

    extra = {key: hit_rate(x, y) for key, (x, y) in (corrupted or {}).items()}
    if domains:
        extra.update(domain_summary([(name, hit_rate(x, y)) for name, x, y in domains], data.domain))
    return EvalResult(
        num_test=len(data.test_y),
        loss=float(F.cross_entropy(logits, data.test_y)),
        accuracy=float((logits.argmax(1) == data.test_y).float().mean()),
        shift_accuracy=accuracies,
        extra=extra,
    )
