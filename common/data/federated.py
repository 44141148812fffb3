"""One client's view of a federated dataset: its train/test tensors and its shifted test plan."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
import torch

from common.data.corruptions import require_images
from common.data.datasets import DataError, DatasetArrays, load_dataset, normalize
from common.data.noise import flip_labels, seeded_client_ids, shift_labels
from common.data.partitioners import PARTITION_SPECS, FederatedSplit
from common.data.settings import DataSettings, SplitSettings
from common.data.shift import ShiftPlan, make_shift_plan
from common.seeding import derive_seed


@dataclass(frozen=True)
class ClientData:
    """Tensors one client trains and evaluates on."""

    partition_id: int
    num_classes: int
    input_shape: tuple[int, ...]
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    shift_x: torch.Tensor  # the pool draws of the shift plan, in plan order
    shift_y: torch.Tensor
    shift_plan: ShiftPlan
    num_partitions: int = 0
    dirty: bool = False  # training labels partly flipped (dirty-clients / dirty-fraction)
    attacker: bool = False  # simulated model-replacement attacker (attack-clients): labels shifted, upload boosted
    domain: int = -1  # multi-domain data: this client's domain, and that domain's held-out test data
    domain_x: torch.Tensor | None = None
    domain_y: torch.Tensor | None = None

    @property
    def num_train(self) -> int:
        """Training samples held."""
        return len(self.train_y)

    @cached_property
    def test_and_draws(self) -> torch.Tensor:
        """The test inputs followed by the shift draws' (an evaluation runs one pass over both; made once)."""
        return torch.cat([self.test_x, self.shift_x]) if len(self.shift_x) else self.test_x


def dataset_for(data: DataSettings) -> DatasetArrays:
    """The run's whole dataset (cached per process)."""
    return load_dataset(data.dataset, data.data_dir, data.split.allow_download)


@lru_cache(maxsize=4)
def _split_cached(settings: SplitSettings, num_clients: int) -> FederatedSplit:
    data = load_dataset(settings.dataset, settings.data_dir, settings.allow_download)
    return PARTITION_SPECS[settings.partition].split(settings, data, num_clients)


_FAILED_SPLITS: dict[tuple[SplitSettings, int], DataError] = {}


def federated_split(data: DataSettings, num_clients: int) -> FederatedSplit:
    """The run's partition of its dataset over `num_clients` clients (cached per process on the split settings,
    failures too: a partition that cannot be made is tried once, not once per message)."""
    key = (data.split, num_clients)
    if key in _FAILED_SPLITS:
        raise _FAILED_SPLITS[key]
    try:
        return _split_cached(*key)
    except DataError as exc:
        _FAILED_SPLITS[key] = exc
        raise


def _tensors(data: DatasetArrays, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(normalize(data, data.x[idx])), torch.from_numpy(data.y[idx])


def client_data(settings: DataSettings, partition_id: int, num_clients: int) -> ClientData:
    """Materialize client `partition_id`'s tensors."""
    if not 0 <= partition_id < num_clients:
        raise DataError(f"partition-id {partition_id} is outside 0..{num_clients - 1}")
    data = dataset_for(settings)
    require_images(data, settings.corruptions)  # refused at the handshake, not at the first evaluation
    split = federated_split(settings, num_clients)
    plan = make_shift_plan(split.test[partition_id], split.pool, derive_seed(settings.seed, "shift", partition_id))
    train_x, train_y = _tensors(data, split.train[partition_id])
    dirty = settings.dirty_fraction > 0 and partition_id in seeded_client_ids(
        num_clients, settings.dirty_clients, derive_seed(settings.seed, "dirty-clients")
    )
    if dirty:
        train_y = torch.from_numpy(
            flip_labels(
                train_y.numpy(),
                settings.dirty_fraction,
                data.num_classes,
                derive_seed(settings.seed, "dirty-labels", partition_id),
            )
        )
    attacker = partition_id in seeded_client_ids(
        num_clients, settings.attack_clients, derive_seed(settings.seed, "attackers")
    )
    if attacker:
        train_y = torch.from_numpy(shift_labels(train_y.numpy(), data.num_classes))
    test_x, test_y = _tensors(data, split.test[partition_id])
    shift_x, shift_y = _tensors(data, plan.draws)
    domain, domain_x, domain_y = -1, None, None
    if split.domain_of:
        domain = split.domain_of[partition_id]
        domain_x, domain_y = _tensors(data, split.domain_test[domain])
    return ClientData(
        partition_id,
        data.num_classes,
        data.input_shape,
        train_x,
        train_y,
        test_x,
        test_y,
        shift_x,
        shift_y,
        plan,
        num_clients,
        dirty,
        attacker,
        domain,
        domain_x,
        domain_y,
    )


_POOLED: dict[tuple[SplitSettings, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def pooled_test(data: DataSettings, num_clients: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pooled test data of all clients (FLIU's Acc(G) set): a seeded `stage-test-size` subset, 0 = all."""
    key = (data.split, num_clients, data.stage_test_size)
    if key not in _POOLED:
        pool = federated_split(data, num_clients).pool
        size = data.stage_test_size
        if 0 < size < len(pool):
            rng = np.random.default_rng(derive_seed(data.seed, "stage-pool"))
            pool = np.sort(rng.choice(pool, size=size, replace=False))
        _POOLED.clear()
        _POOLED[key] = _tensors(dataset_for(data), pool)
    return _POOLED[key]
