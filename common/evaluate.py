"""The one evaluation loop: logits, loss, accuracy, and accuracy at every test-time shift degree."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from . import profiling
from .data.federated import ClientData
from .data.shift import shifted_correct


@torch.no_grad()
def predict_logits(model: nn.Module, x: torch.Tensor, batch_size: int = 512,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    """Logits of `model` on `x`, batched, on the CPU."""
    model.to(device).eval()
    if len(x) == 0:
        return torch.empty(0)
    outs = [model(x[i:i + batch_size].to(device)).float().cpu() for i in range(0, len(x), batch_size)]
    return torch.cat(outs)


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


def shift_key(degree: float) -> str:
    """Metric name of the accuracy at a shift degree, e.g. 'acc-shift-0.4'."""
    return f"acc-shift-{degree:g}"


def shift_accuracy(predict: Callable[[torch.Tensor], torch.Tensor], data: ClientData,
                   degrees: tuple[float, ...]) -> dict[float, float]:
    """Accuracy of any label predictor at each shift degree (one pass over the test set, one over the draws)."""
    if len(data.test_y) == 0:
        return {d: float("nan") for d in degrees}
    own_correct = (predict(data.test_x) == data.test_y).numpy()
    needs_draws = any(d > 0 for d in degrees)
    draw_correct = (predict(data.shift_x) == data.shift_y).numpy() if needs_draws else own_correct
    return shifted_correct(data.shift_plan, own_correct, draw_correct, degrees)


@profiling.timed("evaluate")
def evaluate_client(model: nn.Module, data: ClientData, degrees: tuple[float, ...],
                    device: torch.device | str = "cpu") -> EvalResult:
    """Loss and accuracy on the client's own test set, and accuracy at each shift degree."""
    if len(data.test_y) == 0:
        return EvalResult(0, float("nan"), float("nan"), {d: float("nan") for d in degrees})
    logits = predict_logits(model, data.test_x, device=device)
    cached = {id(data.test_x): logits}

    def predict(x: torch.Tensor) -> torch.Tensor:
        out = cached.get(id(x))
        return (out if out is not None else predict_logits(model, x, device=device)).argmax(1)

    accuracies = shift_accuracy(predict, data, degrees)
    return EvalResult(num_test=len(data.test_y), loss=float(F.cross_entropy(logits, data.test_y)),
                      accuracy=float((logits.argmax(1) == data.test_y).float().mean()), shift_accuracy=accuracies)
