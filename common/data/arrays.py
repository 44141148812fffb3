"""What every data set loader returns, and the error it raises."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class DataError(RuntimeError):
    """Data that cannot be loaded; the message names the files expected and where."""


@dataclass(frozen=True)
class DatasetArrays:
    """A whole dataset: train and test pooled into x (N, C, H, W), (N, C, T) or (N, F) uint8/float32 and y int64."""

    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    scale: float  # x / scale lies in [0, 1]
    domain: np.ndarray | None = None  # domain index of every sample (multi-domain data sets)
    domain_names: tuple[str, ...] = ()
    natural_id: np.ndarray | None = None  # natural client of every sample (FEMNIST's writer, HAR's subject)
    natural_kind: str = ""  # what a natural id is: "writer", "subject"

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample."""
        return tuple(self.x.shape[1:])
