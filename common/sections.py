"""The run config's sections beside the data's (common/data/settings.py): frozen groups of its keys, which the code
reading one part of a run takes instead of the whole config. `RunConfig` builds them from its flat keys."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TrainingSettings:
    """A client's local training: epochs, batches, optimizer and the learning-rate schedule."""

    local_epochs: int
    batch_size: int
    optimizer: str
    lr: float
    momentum: float
    weight_decay: float
    lr_decay: float
    lr_decay_step: str  # `round` or `client`

    def lr_after(self, steps: int) -> float:
        """The learning rate after `steps` decay steps."""
        return self.lr * self.lr_decay**steps


@dataclass(frozen=True)
class EvaluationSettings:
    """What an evaluation reply carries and what the server does with the curve: the shift degrees, the corruptions
    and domains measured, the newcomers' fine-tuning, and the plateau rule."""

    shift_degrees: tuple[float, ...]
    corruptions: tuple[str, ...]
    corruption_severities: tuple[int, ...]
    domains: bool  # the `domains` partition: every domain's accuracy, the seen and the unseen domains'
    holdout_finetune_epochs: int
    num_rounds: int
    stop_patience: int
    stop_min_delta: float


@dataclass(frozen=True)
class FaultSettings:
    """The simulated faults and attacks of a run (the dirty and attacking clients' labels are the data's)."""

    drop_rate: float
    straggler_rate: float
    attack_boost: float
    attack_declare: int
    attack_walk: float
    seed: int


@dataclass(frozen=True)
class PrivacySettings:
    """Client-level differential privacy of a run (run-config `dp`, docs/privacy.md)."""

    dp: str
    dp_clip_norm: float
    dp_noise_multiplier: float
    dp_target_epsilon: float
    dp_noise_seed: int
    dp_delta: float
    dp_adaptive_clip: bool
    dp_clip_quantile: float
    dp_clip_learning_rate: float
    dp_local_metrics: str

    @property
    def withholds_metrics(self) -> bool:
        """Local DP with `dp-local-metrics` = withhold: the clients report no statistic of their data (no loss,
        sample or step counts, FLOPs or evaluation), since the epsilon covers their noised uploads only."""
        return self.dp == "local" and self.dp_local_metrics == "withhold"


@dataclass(frozen=True)
class OutputSettings:
    """Where a run writes: its results folder, checkpoints, clients' state and trackers."""

    results_dir: Path  # resolved: the config value, else $PFL_RESULTS_DIR, else ~/pflower-results
    run_name: str
    resume: str
    checkpoint_every: int
    client_state_dir: str
    message_digests: bool
    tensorboard: bool
    mlflow_uri: str
