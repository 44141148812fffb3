"""The partitioner registry: each way of splitting a data set over clients is one `PartitionSpec` (its name, a line
for the docs, the run-config keys it reads and the function that gives every client its training and test indices).
The `partition` key's choices and help, and the split the clients and the server share, all read it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from common.data.datasets import DataError, DatasetArrays
from common.data.domains import domain_partition
from common.data.natural import natural_partition
from common.data.partition import grouped_exact, partition, train_test_split
from common.data.partition_file import read_partition_file
from common.data.settings import SplitSettings
from common.seeding import derive_seed


@dataclass(frozen=True)
class FederatedSplit:
    """Every client's train and test dataset indices, and the pooled test indices (the shift pool)."""

    train: tuple[np.ndarray, ...]
    test: tuple[np.ndarray, ...]
    domain_of: tuple[int, ...] = ()  # multi-domain data: each client's domain
    domain_test: tuple[np.ndarray, ...] = ()  # and each domain's held-out test indices

    @cached_property
    def pool(self) -> np.ndarray:
        """Pooled test data of all clients: the meta-distribution test-time shift draws from (made once a split:
        every client's data asks for it, and at 1,000 clients joining the test sets took 0.5 ms a time)."""
        pool = np.concatenate(self.test)
        pool.flags.writeable = False
        return pool


Split = Callable[[SplitSettings, DatasetArrays, int], FederatedSplit]  # settings, whole data set, clients -> split


@dataclass(frozen=True)
class PartitionSpec:
    """One partition scheme: its name, its line in the docs, the run-config keys it reads besides `dataset`,
    `seed`, `test-fraction` and `max-samples`, and its split."""

    name: str
    summary: str
    split: Split
    reads: tuple[str, ...] = ()


def _subset(settings: SplitSettings, size: int) -> np.ndarray:
    """The samples partitioned: all, or a seeded subset of `max-samples` of them (CPU presets)."""
    subset = np.arange(size)
    if 0 < settings.max_samples < size:
        rng = np.random.default_rng(derive_seed(settings.seed, "max-samples"))
        subset = np.sort(rng.choice(subset, size=settings.max_samples, replace=False))
    return subset


def _split_each(parts: list[np.ndarray], settings: SplitSettings) -> FederatedSplit:
    """Each client's samples cut into training and test by `test-fraction`, seeded per client."""
    pairs = [
        train_test_split(idx, settings.test_fraction, derive_seed(settings.seed, "split", c))
        for c, idx in enumerate(parts)
    ]
    return FederatedSplit(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))


def _by_labels(scheme: str) -> Split:
    """A scheme of common/data/partition.py that deals the (subset's) samples by their labels."""

    def split(settings: SplitSettings, data: DatasetArrays, num_clients: int) -> FederatedSplit:
        subset = _subset(settings, len(data.y))
        seed = derive_seed(settings.seed, "partition")
        parts = partition(data.y[subset], scheme, num_clients, seed, settings.dirichlet_alpha)
        return _split_each([subset[p] for p in parts], settings)

    return split


def _grouped_exact(settings: SplitSettings, data: DatasetArrays, num_clients: int) -> FederatedSplit:
    """The FedAMP paper's training and test counts per client (`test-fraction` does not apply)."""
    subset = _subset(settings, len(data.y))
    train, test = grouped_exact(data.y[subset], num_clients, derive_seed(settings.seed, "partition"))
    return FederatedSplit(tuple(subset[p] for p in train), tuple(subset[p] for p in test))


def _natural(settings: SplitSettings, data: DatasetArrays, num_clients: int) -> FederatedSplit:
    """One client per writer or subject."""
    if data.natural_id is None:
        raise DataError(
            f"partition 'natural' needs a data set with natural clients (femnist, femnist-digits: writers; har: "
            f"subjects), not '{settings.dataset}'"
        )
    subset = _subset(settings, len(data.y))
    parts = natural_partition(
        data.natural_id[subset], num_clients, settings.natural_min_samples, data.natural_kind, settings.dataset
    )
    return _split_each([subset[p] for p in parts], settings)


def _domains(settings: SplitSettings, data: DatasetArrays, num_clients: int) -> FederatedSplit:
    """Each client a share of one domain; each domain's held-out test set."""
    if data.domain is None:
        raise DataError(f"partition 'domains' needs a multi-domain data set (digit-domains), not '{settings.dataset}'")
    parts, domain_of, held_out = domain_partition(
        data.domain,
        num_clients,
        settings.domain_share,
        settings.domain_test_size,
        derive_seed(settings.seed, "partition"),
    )
    split = _split_each(parts, settings)
    return FederatedSplit(split.train, split.test, tuple(domain_of), tuple(held_out))


def _from_file(settings: SplitSettings, data: DatasetArrays, num_clients: int) -> FederatedSplit:
    """Every client's indices as a file gives them."""
    if not settings.partition_file:
        raise DataError("partition 'file' needs run-config 'partition-file' (the absolute path of an .npz)")
    if settings.max_samples:
        raise DataError("partition 'file' takes the file's indices as they are: set max-samples to 0")
    return FederatedSplit(*read_partition_file(settings.partition_file, num_clients, len(data.y)))


_SPECS = (
    PartitionSpec("iid", "samples dealt uniformly at random", _by_labels("iid")),
    PartitionSpec(
        "dirichlet",
        "per class, a Dir(alpha) vector over clients splits its samples: label and quantity skew",
        _by_labels("dirichlet"),
        ("dirichlet-alpha",),
    ),
    PartitionSpec(
        "pathological", "2 classes per client; 10% of the clients hold half of the samples", _by_labels("pathological")
    ),
    PartitionSpec(
        "ls",
        "FLIU's label skew: Dirichlet label rows balanced by Sinkhorn-Knopp, equal client sizes, every sample used",
        _by_labels("ls"),
        ("dirichlet-alpha",),
    ),
    PartitionSpec(
        "qs", "FLIU's quantity skew: Dirichlet client sizes, balanced labels", _by_labels("qs"), ("dirichlet-alpha",)
    ),
    PartitionSpec("lsqs", "FLIU's label and quantity skew together", _by_labels("lsqs"), ("dirichlet-alpha",)),
    PartitionSpec(
        "grouped",
        "FedAMP's groups: 5 groups of clients, 80% of each client's data from its group's 2 classes, "
        "500/400/300/200/100 samples per client, split by `test-fraction`",
        _by_labels("grouped"),
    ),
    PartitionSpec(
        "grouped-exact",
        "as the FedAMP paper: 500/400/300/200/100 training samples plus 100 test samples per client, both with the "
        "80/20 class mix; `test-fraction` does not apply",
        _grouped_exact,
    ),
    PartitionSpec(
        "domains",
        "DapperFL's: on digit-domains, each client holds `domain-share` of one domain",
        _domains,
        ("domain-share", "domain-test-size"),
    ),
    PartitionSpec(
        "natural",
        "femnist, femnist-digits, har: one client per writer or subject",
        _natural,
        ("natural-min-samples",),
    ),
    PartitionSpec(
        "file", "every client's train and test indices from `partition-file`", _from_file, ("partition-file",)
    ),
)
PARTITION_SPECS: dict[str, PartitionSpec] = {spec.name: spec for spec in _SPECS}


def partition_help() -> str:
    """The `partition` key's help, one clause per scheme."""
    return "; ".join(f"`{spec.name}` ({spec.summary})" for spec in _SPECS)
