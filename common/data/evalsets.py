"""Evaluation-only test sets, made once per process: a client's test split under each configured corruption, and
every domain's held-out test data (multi-domain data)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import torch

from common.data.arrays import DatasetArrays
from common.data.corruptions import corrupt, require_images
from common.data.federated import dataset_for, federated_split
from common.data.settings import DataSettings
from common.seeding import derive_seed

CACHE_BYTES = 1 << 30  # corrupted raw pixels kept per process; the least recently used client's are dropped first
_CORRUPTED: OrderedDict[tuple, dict[tuple[str, int], np.ndarray]] = OrderedDict()
_DOMAINS: dict[tuple, tuple[tuple[str, torch.Tensor, torch.Tensor], ...]] = {}


def _digest(*arrays: np.ndarray) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()


def corrupt_split(
    data: DatasetArrays,
    indices: np.ndarray,
    names: tuple[str, ...],
    severities: tuple[int, ...],
    seed: int,
    partition_id: int,
) -> dict[tuple[str, int], np.ndarray]:
    """The raw pixels of `indices` under each corruption at each severity, each seeded by (seed, client, name,
    severity) alone, so any subset or order of them gives the same images."""
    raw = data.x[indices]
    return {
        (name, severity): corrupt(
            raw,
            name,
            severity,
            np.random.default_rng(derive_seed(seed, "corruption", partition_id, name, severity)),
            data.scale,
        )
        for name in names
        for severity in severities
    }


def normalized(data: DatasetArrays, raw: np.ndarray) -> torch.Tensor:
    """Raw pixels -> the float32 tensor the models take (as datasets.normalize, in place on one copy)."""
    shape = (1, -1, *([1] * (raw.ndim - 2)))
    std = torch.tensor(data.std, dtype=torch.float32).reshape(shape)
    mean = torch.tensor(data.mean, dtype=torch.float32).reshape(shape)
    return torch.from_numpy(raw).to(torch.float32).mul_(1.0 / (data.scale * std)).sub_(mean / std)


def corrupted_test(
    settings: DataSettings, partition_id: int, num_clients: int
) -> dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]]:
    """Client `partition_id`'s test split (a seeded `corruption-eval-size` subset; 0: all) under every
    (corruption, severity) of the run as (inputs, labels), normalized like the clean test data; empty when the run
    has no corruptions."""
    if not settings.corruptions:
        return {}
    data = dataset_for(settings)
    require_images(data, settings.corruptions)
    indices = federated_split(settings, num_clients).test[partition_id]
    if 0 < settings.corruption_eval_size < len(indices):
        rng = np.random.default_rng(derive_seed(settings.seed, "corruption-eval", partition_id))
        indices = np.sort(rng.choice(indices, size=settings.corruption_eval_size, replace=False))
    key = (
        settings.dataset,
        settings.data_dir,
        settings.seed,
        partition_id,
        settings.corruptions,
        settings.corruption_severities,
        _digest(indices),
    )
    raw = _CORRUPTED.get(key)
    if raw is None:
        raw = corrupt_split(
            data, indices, settings.corruptions, settings.corruption_severities, settings.seed, partition_id
        )
        _CORRUPTED[key] = raw
        while len(_CORRUPTED) > 1 and sum(a.nbytes for v in _CORRUPTED.values() for a in v.values()) > CACHE_BYTES:
            _CORRUPTED.popitem(last=False)
    _CORRUPTED.move_to_end(key)
    labels = torch.from_numpy(data.y[indices])
    return {k: (normalized(data, v), labels) for k, v in raw.items()}


def domain_tests(settings: DataSettings, num_clients: int) -> tuple[tuple[str, torch.Tensor, torch.Tensor], ...]:
    """Every domain's held-out test data (name, x, y), a seeded `domain-eval-size` subset of each (0: all);
    empty unless the run uses the `domains` partition."""
    if settings.split.partition != "domains":
        return ()
    split = federated_split(settings, num_clients)
    if not split.domain_of:
        return ()
    key = (settings.dataset, settings.data_dir, settings.seed, settings.domain_eval_size, _digest(*split.domain_test))
    if key not in _DOMAINS:
        data = dataset_for(settings)
        sets = []
        for d, held in enumerate(split.domain_test):
            idx = held
            if 0 < settings.domain_eval_size < len(held):
                rng = np.random.default_rng(derive_seed(settings.seed, "domain-eval", d))
                idx = np.sort(rng.choice(held, size=settings.domain_eval_size, replace=False))
            name = data.domain_names[d] if d < len(data.domain_names) else str(d)
            sets.append((name, normalized(data, data.x[idx]), torch.from_numpy(data.y[idx])))
        _DOMAINS.clear()
        _DOMAINS[key] = tuple(sets)
    return _DOMAINS[key]
