"""Model zoo; every model is `head(body(x))`, so algorithms can split shared and personal parts by name."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.modules.utils import _pair

from common.data.datasets import DATASET_SPECS
from common.hparams import ConfigError
from common.learning.model_specs import MODEL_SPECS
from common.methods.channels import ChannelGroup, channel_groups
from common.methods.masks import prunable_names
from common.methods.personal import norm_entries


class SplitModel(nn.Module):
    """A classifier made of a feature extractor `body` and a classifier `head`."""

    SPLITS_FEATURES = True  # the training loop takes body(x) as the features an extra loss sees (no import of this)

    def __init__(self, body: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits."""
        return self.head(self.body(x))

    def head_names(self) -> list[str]:
        """State-dict keys of the head."""
        return [k for k in self.state_dict() if k.startswith("head.")]

    def body_names(self) -> list[str]:
        """State-dict keys of the body."""
        return [k for k in self.state_dict() if k.startswith("body.")]


def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: int = 128) -> SplitModel:
    """Two-layer perceptron for small flat inputs (the embedded digits default)."""
    body = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), hidden), nn.ReLU())
    return SplitModel(body, nn.Linear(hidden, num_classes))


def dnn_har(input_shape: tuple[int, ...], num_classes: int, bn: bool = False) -> SplitModel:
    """The DNN for UCI HAR: an MLP on the flattened window (9 x 128 = 1152 -> 256 -> 128, ReLU), classifier
    128 -> classes; 329k parameters (`bn`: batch normalization after each hidden layer, for FedBN)."""
    norm = nn.BatchNorm1d if bn else None
    body = nn.Sequential(
        nn.Flatten(),
        nn.Linear(int(np.prod(input_shape)), 256),
        *_norm(256, norm),
        nn.ReLU(),
        nn.Linear(256, 128),
        *_norm(128, norm),
        nn.ReLU(),
    )
    return SplitModel(body, nn.Linear(128, num_classes))


def _norm(channels: int, kind: type[nn.Module] | None) -> list[nn.Module]:
    return [kind(channels)] if kind is not None else []


def mlp_bn(input_shape: tuple[int, ...], num_classes: int, hidden: int = 128) -> SplitModel:
    """The MLP with batch normalization after its hidden layer (for FedBN)."""
    body = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), hidden), nn.BatchNorm1d(hidden), nn.ReLU())
    return SplitModel(body, nn.Linear(hidden, num_classes))


class _ChannelsLastMaxPool(torch.autograd.Function):
    """Max pooling of an NCHW CPU tensor computed in channels-last order, its backward by PyTorch's own kernel from
    the same indices: the values, indices and gradients of F.max_pool2d, ties included."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, *args: Any) -> torch.Tensor:
        """(x, kernel, stride, padding, dilation, ceil_mode) -> the pooled x, contiguous."""
        out, indices = torch.ops.aten.max_pool2d_with_indices(x.contiguous(memory_format=torch.channels_last), *args)
        ctx.args = args
        ctx.save_for_backward(x, indices.contiguous())
        return out.contiguous()

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """The input's gradient: each output's gradient at its maximum's position."""
        x, indices = ctx.saved_tensors
        grad = torch.ops.aten.max_pool2d_with_indices_backward(grads[0].contiguous(), x, *ctx.args, indices)
        return (grad, *(None for _ in ctx.args))


class MaxPool2d(nn.MaxPool2d):
    """nn.MaxPool2d, bit for bit (values, ties and gradients), that pools a 4-D CPU input in channels-last order:
    PyTorch's CPU kernel for contiguous NCHW runs 3x slower (10.8 -> 3.5 ms on cnn-mnist's first pooling, batch
    100, one thread; measured interleaved in one run: a training step 87 -> 79 ms, a forward pass without autograd
    37 -> 28 ms)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The max-pooled input, contiguous as before."""
        if x.dim() != 4 or x.device.type != "cpu" or self.return_indices:
            return super().forward(x)
        kernel = _pair(self.kernel_size)
        args = (kernel, _pair(self.stride or kernel), _pair(self.padding), _pair(self.dilation), self.ceil_mode)
        if torch.is_grad_enabled() and x.requires_grad:
            return _ChannelsLastMaxPool.apply(x, *args)
        return torch.ops.aten.max_pool2d(x.contiguous(memory_format=torch.channels_last), *args).contiguous()


def cnn_mnist(input_shape: tuple[int, ...], num_classes: int, bn: bool = False) -> SplitModel:
    """The MNIST CNN of McMahan et al. (2017): 2 x (5x5 conv, 2x2 max-pool), FC 512, softmax; 1.66M params.
    With `bn`, batch normalization follows each convolution and the FC layer (for FedBN)."""
    channels, height, width = input_shape
    norm2d, norm1d = (nn.BatchNorm2d, nn.BatchNorm1d) if bn else (None, None)
    body = nn.Sequential(
        nn.Conv2d(channels, 32, 5, padding=2),
        *_norm(32, norm2d),
        nn.ReLU(),
        MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2),
        *_norm(64, norm2d),
        nn.ReLU(),
        MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * (height // 4) * (width // 4), 512),
        *_norm(512, norm1d),
        nn.ReLU(),
    )
    return SplitModel(body, nn.Linear(512, num_classes))


def cnn_cifar(input_shape: tuple[int, ...], num_classes: int, bn: bool = False) -> SplitModel:
    """The CIFAR-10 CNN common in PFL benchmarks: 2 x (5x5 conv, max-pool), FC 512, classifier (`bn`: as above)."""
    channels, height, width = input_shape
    out_h, out_w = ((height - 4) // 2 - 4) // 2, ((width - 4) // 2 - 4) // 2
    norm2d, norm1d = (nn.BatchNorm2d, nn.BatchNorm1d) if bn else (None, None)
    body = nn.Sequential(
        nn.Conv2d(channels, 32, 5),
        *_norm(32, norm2d),
        nn.ReLU(),
        MaxPool2d(2),
        nn.Conv2d(32, 64, 5),
        *_norm(64, norm2d),
        nn.ReLU(),
        MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * out_h * out_w, 512),
        *_norm(512, norm1d),
        nn.ReLU(),
    )
    return SplitModel(body, nn.Linear(512, num_classes))


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm, and a projection shortcut where the shape
    changes."""

    def __init__(self, in_channels: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride, bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))."""
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNetBody(nn.Module):
    """ResNet10 for 32x32 inputs without the classifier: a 3x3 stem and one basic block per stage (widths w, 2w,
    4w, 8w; strides 1, 2, 2, 2), global average pooling; outputs 8w features."""

    def __init__(self, in_channels: int, width: int = 64) -> None:
        super().__init__()
        widths = (width, 2 * width, 4 * width, 8 * width)
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layers = nn.Sequential(
            *[
                BasicBlock(cin, cout, 1 if i == 0 else 2)
                for i, (cin, cout) in enumerate(zip((width, *widths[:-1]), widths))
            ]
        )
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.features = widths[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features."""
        return self.pool(self.layers(self.stem(x)))

    def channel_groups(self, prefix: str) -> list[ChannelGroup]:
        """Prunable channels: each block's inner channels (conv1 and bn1 out, conv2 in). The channels of the
        residual stream (stem, block outputs, shortcuts) stay: pruning them would need one mask per stage."""
        blocks = [block for block in self.layers if isinstance(block, BasicBlock)]
        return [
            ChannelGroup(
                block.conv1.out_channels,
                (f"{prefix}.layers.{i}.conv1", f"{prefix}.layers.{i}.bn1"),
                ((f"{prefix}.layers.{i}.conv2", 1),),
            )
            for i, block in enumerate(blocks)
        ]


def resnet10(input_shape: tuple[int, ...], num_classes: int, width: int = 64) -> SplitModel:
    """ResNet10 for 32x32 images (DapperFL's Digits backbone; width 64: 4.9M parameters)."""
    body = ResNetBody(input_shape[0], width)
    return SplitModel(body, nn.Linear(body.features, num_classes))


def build_model(
    name: str,
    dataset: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int,
    arrays: Sequence[np.ndarray] | None = None,
) -> SplitModel:
    """A freshly initialized model (a copy of the seeded one this process built once); `auto` picks the dataset's
    usual one; the init depends only on `seed`. Given `arrays` (state-dict order), the model holds copies of them
    instead, as set_arrays would load them."""
    resolved = DATASET_SPECS[dataset].default_model if name == "auto" else name
    spec = MODEL_SPECS.get(resolved)
    if spec is None:
        raise ConfigError(f"run-config 'model' = {name!r} is not valid; allowed values: auto, {', '.join(MODEL_SPECS)}")
    if spec.image_input and len(input_shape) != 3:
        raise ConfigError(f"model '{resolved}' needs image input (C, H, W); dataset '{dataset}' gives {input_shape}")
    if spec.min_side and min(input_shape[1:]) < spec.min_side:
        raise ConfigError(f"model '{resolved}' needs larger images than {input_shape} of dataset '{dataset}'")
    template = _initialized(resolved, tuple(input_shape), num_classes, seed)
    if arrays is None:
        arrays = [entry.detach().numpy() for entry in template.state_dict().values()]
    return _holding(template, arrays)


def _holding(template: SplitModel, arrays: Sequence[np.ndarray]) -> SplitModel:
    """deepcopy(template) + set_arrays(arrays), without first copying the template's tensors: each state-dict entry
    becomes a copy of its array, in the entry's dtype."""
    state = template.state_dict(keep_vars=True)
    if len(state) != len(arrays):
        raise ValueError(f"expected {len(state)} arrays, got {len(arrays)}")
    memo: dict[int, Any] = {}
    for (key, entry), array in zip(state.items(), arrays):
        if tuple(entry.shape) != tuple(np.shape(array)):
            raise ValueError(f"array for '{key}' has shape {tuple(np.shape(array))}, expected {tuple(entry.shape)}")
        value = torch.tensor(np.asarray(array), dtype=entry.dtype)
        memo[id(entry)] = nn.Parameter(value, entry.requires_grad) if isinstance(entry, nn.Parameter) else value
    return _clone(template, memo)


_IMMUTABLE = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, frozenset)


def _clone(module: nn.Module, memo: dict[int, Any]) -> Any:
    """What copy.deepcopy(module, memo) makes of a model whose parameters and buffers are all in `memo`, without
    deepcopy's walk of every attribute (4 ms of every message's model build): submodules cloned, parameter,
    buffer and hook dicts rebuilt, other containers copied, immutable values shared; anything else deep-copied."""
    clone = module.__class__.__new__(module.__class__)
    for key, value in module.__dict__.items():
        if key == "_modules":
            value = value.__class__((name, None if sub is None else _clone(sub, memo)) for name, sub in value.items())
        elif key in ("_parameters", "_buffers"):
            value = value.__class__((name, None if t is None else memo[id(t)]) for name, t in value.items())
        elif isinstance(value, (dict, set, list)) and all(isinstance(item, _IMMUTABLE) for item in _items(value)):
            value = copy.copy(value)
        elif not isinstance(value, _IMMUTABLE) and not (
            isinstance(value, tuple) and all(isinstance(item, _IMMUTABLE) for item in value)
        ):
            value = copy.deepcopy(value, memo)
        clone.__dict__[key] = value
    return clone


def _items(container: dict | set | list) -> list[Any]:
    return [*container.keys(), *container.values()] if isinstance(container, dict) else list(container)


@lru_cache(maxsize=4)
def _initialized(resolved: str, input_shape: tuple[int, ...], num_classes: int, seed: int) -> SplitModel:
    """The seeded initialization, built once per process (a copy costs a fifth of a build: every client message
    starts from one)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        spec = MODEL_SPECS[resolved]
        return globals()[spec.builder](input_shape, num_classes, **dict(spec.kwargs))


def get_arrays(model: nn.Module) -> list[np.ndarray]:
    """Model state as float32 numpy arrays, in state-dict order (copies)."""
    return [v.detach().cpu().numpy().astype(np.float32, copy=True) for v in model.state_dict().values()]


def set_arrays(model: nn.Module, arrays: list[np.ndarray]) -> None:
    """Load arrays (state-dict order) into the model."""
    keys = list(model.state_dict().keys())
    if len(keys) != len(arrays):
        raise ValueError(f"expected {len(keys)} arrays, got {len(arrays)}")
    with warnings.catch_warnings():
        # received arrays are read-only views of the message's bytes; load_state_dict only reads them (it copies
        # into the model's own tensors), so torch's warning about tensors over non-writable memory does not apply
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        model.load_state_dict({k: torch.from_numpy(np.asarray(a)) for k, a in zip(keys, arrays)}, strict=True)


def array_specs(model: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every state-dict entry, in order: what a valid payload must match."""
    return [(k, tuple(v.shape)) for k, v in model.state_dict().items()]


@dataclass(frozen=True)
class ModelLayout:
    """What the server holds of the model: its initial arrays, (name, shape) specs and prunable layer names."""

    initial: list[np.ndarray]
    specs: list[tuple[str, tuple[int, ...]]]
    prunable: tuple[str, ...] = ()
    norm: tuple[str, ...] = ()  # entries of normalization layers (parameters and statistics)
    channels: tuple[ChannelGroup, ...] = ()  # structured-pruning plan (empty where the model has none)
    params: tuple[str, ...] = ()  # the entries that are trainable parameters (the others are buffers)

    @classmethod
    def of(cls, model: nn.Module) -> ModelLayout:
        """The layout of a built model (its current weights as the initial arrays)."""
        try:
            groups = tuple(channel_groups(model))
        except ValueError:
            groups = ()
        return cls(
            get_arrays(model),
            array_specs(model),
            tuple(prunable_names(model)),
            tuple(norm_entries(model)),
            groups,
            tuple(name for name, _ in model.named_parameters()),
        )

    def extended(self, modules: nn.Module) -> ModelLayout:
        """This layout with the entries of `modules` (a method's modules beside the model, held and averaged by the
        server like the model's own) after the model's."""
        return ModelLayout(
            [*self.initial, *get_arrays(modules)],
            [*self.specs, *array_specs(modules)],
            self.prunable,
            self.norm,
            self.channels,
            (*self.params, *(name for name, _ in modules.named_parameters())),
        )

    def linear_head(self) -> tuple[int, int]:
        """(features, classes) of a model whose head is one linear layer ('head.weight'); ValueError otherwise."""
        for name, shape in self.specs:
            if name == "head.weight" and len(shape) == 2:
                return int(shape[1]), int(shape[0])
        raise ValueError("the model's head is not one linear layer ('head.weight')")


@lru_cache(maxsize=8)
def model_layout(name: str, dataset: str, input_shape: tuple[int, ...], num_classes: int, seed: int) -> ModelLayout:
    """The layout of build_model's model, made once per process (client halves read its names, shapes and layer
    roles on every message; callers must not change its arrays)."""
    return ModelLayout.of(build_model(name, dataset, input_shape, num_classes, seed))
