"""What the data code reads of a run's config, as frozen sections (`RunConfig.data` builds them from the flat
run-config keys): the partition's inputs (`SplitSettings`, which the split cache keys on) and the rest of what a
client's data and evaluation sets depend on (`DataSettings`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SplitSettings:
    """Everything a run's partition of its data set depends on (besides the number of clients)."""

    dataset: str
    data_dir: str  # the folder the data set is read from (resolved: config, else $PFL_DATA_DIR, else the cache)
    allow_download: bool
    partition: str
    seed: int
    dirichlet_alpha: float
    test_fraction: float
    max_samples: int
    domain_share: float
    domain_test_size: int
    natural_min_samples: int
    partition_file: str


@dataclass(frozen=True)
class DataSettings:
    """The data section of a run config: its split, the evaluation sets' sizes and corruptions, and the simulated
    label faults (dirty and attacking clients)."""

    split: SplitSettings
    stage_test_size: int
    domain_eval_size: int
    corruptions: tuple[str, ...]
    corruption_severities: tuple[int, ...]
    corruption_eval_size: int
    dirty_clients: float
    dirty_fraction: float
    attack_clients: float

    @property
    def dataset(self) -> str:
        """The data set's name."""
        return self.split.dataset

    @property
    def data_dir(self) -> str:
        """The folder the data set is read from."""
        return self.split.data_dir

    @property
    def seed(self) -> int:
        """The run's seed."""
        return self.split.seed
