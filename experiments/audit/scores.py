"""How much of a batch an inversion recovered: PSNR and SSIM per image (torchmetrics), after the best one-to-one
match between reconstructed and true images (the attack does not know their order), and label recovery."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

MAX_PSNR = 100.0  # dB; float32 round-off of a perfect reconstruction sits near 70-90


@dataclass(frozen=True)
class Scores:
    """Per image of the batch, in the true images' order: PSNR (dB) and SSIM of its matched reconstruction."""

    psnr: list[float]
    ssim: list[float]
    match: list[int]  # for each true image, the index of the reconstruction matched to it


def _to_unit(x: torch.Tensor, bounds: tuple[float, float]) -> torch.Tensor:
    """Images in [bounds] mapped to [0, 1]."""
    low, high = bounds
    return ((x - low) / (high - low)).clamp(0, 1)


def image_scores(true: torch.Tensor, reconstructed: torch.Tensor, bounds: tuple[float, float]) -> Scores:
    """PSNR (capped at MAX_PSNR) and SSIM, data range 1 after mapping `bounds` to [0, 1], of each true image against
    the reconstruction the assignment maximizing the total PSNR gives it."""
    from torchmetrics.functional.image import peak_signal_noise_ratio, structural_similarity_index_measure

    a, b = _to_unit(true, bounds), _to_unit(reconstructed, bounds)
    n = a.shape[0]
    psnr = np.array(
        [
            [float(peak_signal_noise_ratio(b[j : j + 1], a[i : i + 1], data_range=1.0)) for j in range(n)]
            for i in range(n)
        ]
    )
    psnr = np.minimum(psnr, MAX_PSNR)  # an exact copy has infinite PSNR: capped, so that means stay finite
    rows, cols = linear_sum_assignment(-psnr)
    kernel = min(7, *a.shape[-2:]) | 1  # odd, at most the image size (digits are 8 x 8)
    ssim = []
    for i, j in zip(rows, cols):
        value = structural_similarity_index_measure(b[j : j + 1], a[i : i + 1], data_range=1.0, kernel_size=kernel)
        ssim.append(float(value[0] if isinstance(value, tuple) else value))
    return Scores([float(psnr[i, j]) for i, j in zip(rows, cols)], ssim, [int(j) for j in cols])


def label_accuracy(true: torch.Tensor, recovered: torch.Tensor) -> float:
    """The share of the batch's labels recovered, as multisets (order does not matter)."""
    common = Counter(true.tolist()) & Counter(recovered.tolist())
    return sum(common.values()) / len(true)
