"""Structured channel pruning: which tensor entries a layer's output channels index, the physically smaller model
that keeps some of them, and the way back to full shape (numpy on the server, torch on the client)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

NORM_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d)
OUT_ENTRIES = ("weight", "bias", "running_mean", "running_var")  # what dim 0 of an `out` layer holds


@dataclass(frozen=True)
class ChannelGroup:
    """The output channels of one layer, pruned together: the layer and the normalization layers after it hold
    them along dim 0 (`out`), the next layers take them along dim 1 (`into`, each channel `repeat` consecutive
    inputs: a flattened feature map)."""

    size: int
    out: tuple[str, ...]
    into: tuple[tuple[str, int], ...]

    @property
    def scorer(self) -> str:
        """The layer whose weights rank the channels (the conv or linear layer that produces them)."""
        return self.out[0]


def sequential_groups(
    body: nn.Sequential, head: nn.Module, prefix: str = "body", head_name: str = "head"
) -> list[ChannelGroup]:
    """The channel groups of a plain stack of conv/linear layers (normalization, activations, pooling and
    flattening between them), ending in the classifier `head`, whose outputs are never pruned."""
    groups: list[ChannelGroup] = []
    size, out = 0, list[str]()

    def close(consumer: str, in_features: int) -> None:
        if size:
            groups.append(ChannelGroup(size, tuple(out), ((consumer, in_features // size),)))

    for name, module in body.named_children():
        full = f"{prefix}.{name}"
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            close(full, module.in_channels if isinstance(module, nn.Conv2d) else module.in_features)
            size, out = (module.out_channels if isinstance(module, nn.Conv2d) else module.out_features), [full]
        elif isinstance(module, NORM_TYPES) and size:
            out.append(full)
    if not isinstance(head, nn.Linear):
        raise ValueError("the classifier head must be one linear layer")
    close(head_name, head.in_features)
    return groups


def channel_groups(model: nn.Module) -> list[ChannelGroup]:
    """The model's prunable channel groups: its body's own plan where it has one (ResNet), else derived."""
    body, head = getattr(model, "body", None), getattr(model, "head", None)
    if body is None or head is None:
        raise ValueError("channel pruning needs a model made of `body` and `head`")
    plan = getattr(body, "channel_groups", None)
    if callable(plan):
        return list(plan("body"))
    if not isinstance(body, nn.Sequential):
        raise ValueError("channel pruning needs a sequential body or one that names its channel groups")
    return sequential_groups(body, head)


def keep_count(size: int, ratio: float) -> int:
    """Channels kept of `size` at pruning ratio `ratio`: size - floor(ratio * size), at least one."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"pruning ratio must lie in [0, 1), got {ratio}")
    return max(1, size - int(np.floor(ratio * size + 1e-9)))


def entry_indices(
    groups: Sequence[ChannelGroup], keep: Sequence[np.ndarray], specs: Sequence[tuple[str, tuple[int, ...]]]
) -> dict[str, dict[int, np.ndarray]]:
    """For every state entry touched by pruning: dim -> the kept indices along it (sorted)."""
    if len(keep) != len(groups):
        raise ValueError(f"{len(keep)} channel masks for {len(groups)} channel groups")
    shapes = dict(specs)
    out: dict[str, dict[int, np.ndarray]] = {}
    for group, mask in zip(groups, keep, strict=True):
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (group.size,) or not mask.any():
            raise ValueError(f"a channel mask must hold {group.size} flags with at least one kept")
        kept = np.flatnonzero(mask)
        for module in group.out:
            for entry in OUT_ENTRIES:
                name = f"{module}.{entry}"
                if name in shapes:
                    out.setdefault(name, {})[0] = kept
        for module, repeat in group.into:
            expanded = (kept[:, None] * repeat + np.arange(repeat)[None, :]).reshape(-1)
            out.setdefault(f"{module}.weight", {})[1] = expanded
    return out


def pruned_shapes(
    specs: Sequence[tuple[str, tuple[int, ...]]], indices: Mapping[str, Mapping[int, np.ndarray]]
) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of the smaller model's entries."""
    out = []
    for name, shape in specs:
        dims = list(shape)
        for dim, idx in indices.get(name, {}).items():
            dims[dim] = len(idx)
        out.append((name, tuple(dims)))
    return out


def take(array: np.ndarray, dims: Mapping[int, np.ndarray]) -> np.ndarray:
    """The kept part of one full-size entry."""
    for dim, idx in sorted(dims.items()):
        array = np.take(array, idx, axis=dim)
    return array


def recover(pruned: np.ndarray, reference: np.ndarray, dims: Mapping[int, np.ndarray]) -> np.ndarray:
    """DapperFL Eq. 6 for one entry: the kept positions from `pruned`, every other one from `reference`."""
    out = np.array(reference, dtype=np.float32, copy=True)
    if not dims:
        return np.asarray(pruned, dtype=np.float32).reshape(reference.shape)
    grid = [dims.get(d, np.arange(reference.shape[d])) for d in range(reference.ndim)]
    out[np.ix_(*grid)] = pruned
    return out


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, new)


def _smaller(module: nn.Module, out_idx: np.ndarray | None, in_idx: np.ndarray | None) -> nn.Module:
    """A copy of a conv, linear or batch-norm layer holding only the given output / input channels."""
    if not isinstance(module, (nn.Conv2d, nn.Linear, *NORM_TYPES)):
        raise ValueError(f"cannot prune channels of {type(module).__name__}")
    new = copy.deepcopy(module)
    with torch.no_grad():
        for name, tensor in list(new.named_parameters(recurse=False)) + list(new.named_buffers(recurse=False)):
            if tensor.ndim == 0:
                continue  # num_batches_tracked
            value = tensor.detach()
            if out_idx is not None:
                value = value[torch.as_tensor(out_idx)]
            if in_idx is not None and name == "weight":
                value = value[:, torch.as_tensor(in_idx)]
            if isinstance(tensor, nn.Parameter):
                setattr(new, name, nn.Parameter(value.clone(), requires_grad=tensor.requires_grad))
            else:
                setattr(new, name, value.clone())
    weight = new.weight
    if isinstance(new, nn.Conv2d):
        new.out_channels, new.in_channels = weight.shape[0], weight.shape[1] * new.groups
    elif isinstance(new, nn.Linear):
        new.out_features, new.in_features = weight.shape[0], weight.shape[1]
    else:
        new.num_features = len(out_idx) if out_idx is not None else new.num_features
    return new


def pruned_model(model: nn.Module, groups: Sequence[ChannelGroup], keep: Sequence[np.ndarray]) -> nn.Module:
    """A physically smaller copy of `model` holding only the kept channels of every group (same entry names)."""
    indices = entry_indices(groups, keep, [(k, tuple(v.shape)) for k, v in model.state_dict().items()])
    small = copy.deepcopy(model)
    paths = {name.rsplit(".", 1)[0] for name in indices}
    for path in sorted(paths):
        out_dims = next(
            (indices[name][0] for name in (f"{path}.{e}" for e in OUT_ENTRIES) if 0 in indices.get(name, {})), None
        )
        in_dims = indices.get(f"{path}.weight", {}).get(1)
        _replace(small, path, _smaller(model.get_submodule(path), out_dims, in_dims))
    return small
