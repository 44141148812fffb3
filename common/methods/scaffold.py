"""SCAFFOLD's control variates as plain functions (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging
for Federated Learning", ICML 2020, Algorithm 1 with option II for c_i+)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

Arrays = Sequence[np.ndarray]


def corrected_gradients(correction: Mapping[str, torch.Tensor]) -> Callable[[nn.Module], None]:
    """An `on_gradients` hook of the training loop: each named parameter's gradient plus its (c - c_i), so that the
    optimizer's step is y <- y - lr (g_i(y) - c_i + c)."""

    def hook(model: nn.Module) -> None:
        for name, param in model.named_parameters():
            if param.grad is not None and name in correction:
                param.grad.add_(correction[name].to(param.grad.device))

    return hook


def client_control(
    c_i: Arrays, c: Arrays, x: Arrays, y: Arrays, steps: int, lr: float
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Option II: c_i+ = c_i - c + (x - y) / (K lr) after K local steps of size lr from x to y; returns c_i+ and
    the change c_i+ - c_i the client uploads. Without a step (K = 0) c_i stays and the change is 0."""
    if steps <= 0:
        return [np.asarray(a, np.float32) for a in c_i], [np.zeros_like(a, np.float32) for a in c_i]
    if lr <= 0:
        raise ValueError(f"SCAFFOLD's option II needs a positive learning rate, got {lr}")
    scale = 1.0 / (steps * lr)
    delta = [
        (-np.asarray(cg, np.float64) + scale * (np.asarray(xg, np.float64) - yg)).astype(np.float32)
        for cg, xg, yg in zip(c, x, y)
    ]
    return [(np.asarray(a, np.float32) + d).astype(np.float32) for a, d in zip(c_i, delta)], delta


def server_control(c: Arrays, mean_delta: Arrays, sampled: int, total: int) -> list[np.ndarray]:
    """c <- c + (|S| / N) mean_S(delta c_i) = c + (1 / N) sum_S delta c_i."""
    share = sampled / total if total > 0 else 0.0
    return [
        (np.asarray(a, np.float32) + share * np.asarray(d, np.float32)).astype(np.float32)
        for a, d in zip(c, mean_delta)
    ]
