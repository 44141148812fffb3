"""The models a run can use, declared once (the registry the `model` key's choices and docs come from): each one's
name, its builder in common/learning/models.py (imported there, so this module stays free of torch), the input it needs
and a line for the docs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """One model: `builder(input_shape, num_classes, **kwargs)` of common/learning/models.py builds it."""

    name: str
    builder: str
    about: str
    kwargs: tuple[tuple[str, Any], ...] = ()
    image_input: bool = False  # needs (channels, height, width) inputs
    min_side: int = 0  # the smallest image side it takes


MODEL_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("mlp", "mlp", "an MLP with 128 hidden units (`digits`' model)"),
        ModelSpec("cnn-mnist", "cnn_mnist", "McMahan et al. CNN, 1.66M parameters", image_input=True, min_side=8),
        ModelSpec(
            "cnn-cifar",
            "cnn_cifar",
            "5x5 convolutions without padding, FC 512; on 28x28 inputs the 582k-parameter CNN other PFL libraries use "
            "for MNIST",
            image_input=True,
            min_side=16,
        ),
        ModelSpec("mlp-bn", "mlp_bn", "`mlp` with batch normalization"),
        ModelSpec(
            "cnn-mnist-bn", "cnn_mnist", "`cnn-mnist` with batch normalization", (("bn", True),), True, min_side=8
        ),
        ModelSpec(
            "cnn-cifar-bn", "cnn_cifar", "`cnn-cifar` with batch normalization", (("bn", True),), True, min_side=16
        ),
        ModelSpec("resnet10", "resnet10", "32x32 images, 4.9M parameters", image_input=True),
        ModelSpec("resnet10-s", "resnet10", "`resnet10` at a quarter of its widths, for CPUs", (("width", 16),), True),
        ModelSpec(
            "dnn-har",
            "dnn_har",
            'HAR: an MLP on the flattened window, 1152-256-128 with ReLU, 329k parameters; DM-PFL\'s HAR "DNN" is not '
            "specified further",
        ),
        ModelSpec("dnn-har-bn", "dnn_har", "`dnn-har` with batch normalization", (("bn", True),)),
    )
}
