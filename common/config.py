"""Typed run configuration: every general key declared once (default, range, help), the algorithm's keys from
its spec; one parse of Flower's run config with one-line errors for bad values."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from common.algorithms import SPECS, DittoParams, FedProxParams, PFedMeParams, param_classes
from common.data.corruptions import CORRUPTIONS, parse_corruptions, parse_severities
from common.data.datasets import DATASET_SPECS
from common.data.partitioners import PARTITION_SPECS, partition_help
from common.data.settings import DataSettings, SplitSettings
from common.hparams import ConfigError, KeyInfo, as_dict, choice, describe, hp, parse_fields
from common.learning.model_specs import MODEL_SPECS
from common.methods.distributed_dp import DISTRIBUTED_DP_REFUSED
from common.methods.privacy import CENTRAL_DP_ON_GLOBAL_MASK, CENTRAL_DP_RECOVERED, CENTRAL_DP_REFUSED, DP_MODES
from common.methods.robust import ROBUST_METHODS, RobustRule
from common.secagg.params import SECAGG_MODES, SECAGG_REFUSED, SecAggParams
from common.sections import EvaluationSettings, FaultSettings, OutputSettings, PrivacySettings, TrainingSettings
from common.storage.run_folder import MESSAGES_FILE
from common.wire.validation import is_folder_name

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

DATASETS = tuple(DATASET_SPECS)  # the registry of common/data/datasets.py
PARTITIONS = tuple(PARTITION_SPECS)  # the registry of common/data/partitioners.py
MODELS = ("auto", *MODEL_SPECS)  # the registry of common/learning/model_specs.py
AUTO_MODEL = {name: spec.default_model for name, spec in DATASET_SPECS.items()}  # what `model=auto` picks
OPTIMIZERS = ("sgd", "adam")
DEVICES = ("auto", "cpu", "cuda")

P = TypeVar("P")
S = TypeVar("S", bound="DataclassInstance")  # a section of the run config (a frozen dataclass)

__all__ = ["ConfigError", "RunConfig", "parse_degrees", "parse_run_config"]


def parse_degrees(key: str, value: Any) -> tuple[float, ...]:
    """Parse '0,0.2,...' (or a list) into sorted unique numbers in [0, 1] (shift degrees, thresholds)."""
    items = value.split(",") if isinstance(value, str) else value
    try:
        degrees = sorted({round(float(item), 6) for item in items if str(item).strip() != ""})
    except (TypeError, ValueError):
        raise ConfigError(f"run-config '{key}' = {value!r} must be comma-separated numbers in [0, 1]") from None
    if not degrees or any(d < 0 or d > 1 for d in degrees):
        raise ConfigError(f"run-config '{key}' = {value!r} must be comma-separated numbers in [0, 1]")
    return tuple(degrees)


def _folder_name(key: str, value: Any) -> str:
    """A name that stays one folder inside results-dir (empty: the default name)."""
    if value == "" or is_folder_name(value):
        return str(value)
    raise ConfigError(
        f"run-config '{key}' = {value!r} must be a folder name of letters, digits, '.', '_' and '-' "
        "(no path separators, not starting with '.', at most 100 characters)"
    )


def _absolute_path(key: str, value: Any) -> str:
    """An absolute path (`~` allowed), or empty."""
    if value == "" or (isinstance(value, str) and Path(value).expanduser().is_absolute()):
        return str(value)
    raise ConfigError(f"run-config '{key}' = {value!r} must be an absolute path")


def _mlflow_uri(key: str, value: Any) -> str:
    """An MLflow tracking URI (a server, a `file:` or `sqlite:` URI) or an absolute folder path, or empty."""
    text = str(value) if isinstance(value, str) else ""
    if value == "" or text.startswith(("http://", "https://", "file:", "sqlite:")):
        return text
    if text and Path(text).expanduser().is_absolute():
        return text
    raise ConfigError(
        f"run-config '{key}' = {value!r} must be an MLflow server URL (http(s)://...), a `file:` URI or an "
        "absolute folder path"
    )


@dataclass(frozen=True)
class RunConfig:
    """Every general run-config key with its default; `params` holds the chosen algorithm's keys (its spec's
    dataclass) and `algorithm_keys` every registered algorithm's keys, validated (for config.json)."""

    algorithm: str = hp("fedavg", "the algorithm", choices=tuple(sorted(SPECS)), allowed="see the next table")
    dataset: str = hp(
        "digits",
        "the data set: " + "; ".join(f"`{name}`: {spec.about}" for name, spec in DATASET_SPECS.items()),
        choices=DATASETS,
    )
    data_dir: str = hp(
        "",
        "folder with `MNIST/raw`, `FashionMNIST/raw`, `cifar-10-batches-py`, `USPS` (torchvision "
        "layout), `FEMNIST_LEAF/femnist_leaf_niid_sf005.npz`, `UCI_HAR/` "
        "(`inertial_x_float32_N-128-9.npy.xz`, `labels_subjects.npz`); empty: `$PFL_DATA_DIR`, "
        "else `~/.cache/pflower/data`. Use an absolute path.",
    )
    allow_download: bool = hp(False, "let torchvision download a missing dataset (needs internet)")
    partition: str = hp(
        "dirichlet",
        partition_help(),
        choices=PARTITIONS,
    )
    domain_share: float = hp(
        0.01,
        "`domains` partition (digit-domains): share of its domain each client takes (DapperFL: 1%)",
        low=0.0,
        high=1.0,
        low_open=True,
    )
    domain_test_size: int = hp(
        1000, "`domains` partition: samples of each domain held out to test the global model on that domain", low=1
    )
    domain_eval_size: int = hp(
        0,
        "`domains` partition: each client's evaluated model is tested on this many "
        "(seeded) of every domain's held-out samples, its own domain and the others (metrics "
        "`acc-domain-<name>`, `acc-seen-domain`, `acc-unseen-domains`); 0: all "
        "`domain-test-size`",
        low=0,
    )
    natural_min_samples: int = hp(
        20,
        "`natural` partition: writers or subjects with fewer samples are dropped "
        "(DM-PFL, A.1.2, excludes clients with only few samples, without a number); "
        "client k holds the k-th largest kept writer or subject, so a run may have fewer "
        "clients than are kept (the largest), not more; each client's samples are split "
        "by `test-fraction` (FEMNIST's own LEAF train/test split is not used)",
        low=2,
    )
    partition_file: str = hp(
        "",
        "`file` partition: absolute path of an .npz with 1-D integer arrays `train_0`, "
        "`test_0`, `train_1`, ... (indices into the dataset in load order, see docs/configuration.md); "
        "a run with N clients uses the file's first N; `test-fraction` and `max-samples` do "
        "not apply",
        parse=_absolute_path,
        allowed="an absolute path",
    )
    dirichlet_alpha: float = hp(0.3, "alpha of every Dirichlet draw of the partition", low=0.0, low_open=True)
    test_fraction: float = hp(
        0.25,
        "each client's samples are split into train and test sets by this fraction",
        low=0.0,
        high=0.9,
        low_open=True,
    )
    max_samples: int = hp(
        0, "partition a seeded subset of this many samples of the dataset (0: all); for quick CPU runs", low=0
    )
    model: str = hp(
        "auto",
        "; ".join(f"`{name}`: {spec.about}" for name, spec in MODEL_SPECS.items())
        + "; `auto` picks by dataset (the `-bn` one for `fedbn`)",
        choices=MODELS,
    )
    num_rounds: int = hp(20, "federated rounds", low=1, high=100_000)
    fraction_train: float = hp(
        0.5,
        "fraction of clients sampled per round (seeded, at least `min-train-clients`)",
        low=0.0,
        high=1.0,
        low_open=True,
    )
    min_train_clients: int = hp(2, "lower bound on clients per round", low=1)
    fraction_evaluate: float = hp(1.0, "fraction of clients evaluated (all by default)", low=0.0, high=1.0)
    eval_every: int = hp(1, "evaluate every N rounds and after the last one (0: never)", low=0)
    stop_patience: int = hp(
        0,
        "stop once the best mean accuracy (shift 0, the evaluated clients' mean) has not risen by more than "
        "`stop-min-delta` in this many rounds; `num-rounds` is then a cap and the summary names the round it "
        "stopped at (0: run every round)",
        low=0,
    )
    stop_min_delta: float = hp(
        0.0,
        "the rise of the best mean accuracy that counts as improving for `stop-patience` (0.001: 0.1 point)",
        low=0.0,
        high=1.0,
    )
    holdout_clients: float = hp(
        0.0,
        "this fraction of the clients (seeded, at least 1 when > 0, never all) never "
        "trains; at every evaluation they receive what a new client would (the algorithm's "
        "newcomer model) and are evaluated as received and after `holdout-finetune-epochs` "
        "of local fine-tuning: the `unseen` row",
        low=0.0,
        high=0.9,
    )
    holdout_finetune_epochs: int = hp(
        1,
        "local fine-tuning epochs of a held-out client before its second evaluation (0: evaluated as received only)",
        low=0,
        high=100,
    )
    local_epochs: int = hp(2, "local training epochs per round", low=0, high=10_000)
    batch_size: int = hp(32, "local training batch size", low=1)
    optimizer: str = hp("sgd", "local optimizer", choices=OPTIMIZERS)
    lr: float = hp(0.05, "local learning rate", low=0.0, high=10.0, low_open=True)
    momentum: float = hp(0.0, "SGD momentum", low=0.0, high=0.999)
    weight_decay: float = hp(0.0, "weight decay of the local optimizer", low=0.0, high=1.0)
    lr_decay: float = hp(
        1.0, "lr is multiplied by this every round (or client step: `lr-decay-step`)", low=0.0, high=1.0, low_open=True
    )
    lr_decay_step: str = hp(
        "round",
        "when lr-decay applies: every server `round` (lr x decay^(round-1)), or per `client`, once per local training "
        "call it made before (PFLlib's scheduler step, which the DM-PFL appendix follows)",
        choices=("round", "client"),
    )
    download: str = hp(
        "stale",
        "sparse algorithms: send the global model to a client only when its copy is `stale`, or `always` (what "
        "dense algorithms do: a like-for-like byte count)",
        choices=("stale", "always"),
    )
    shift_degrees: tuple[float, ...] = hp(
        (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        "test-time shift degrees evaluated every time",
        parse=parse_degrees,
        allowed="comma-separated numbers in [0, 1]",
    )
    corruptions: tuple[str, ...] = hp(
        (),
        "image data sets: every client's test split is also evaluated under these "
        "corruptions (CIFAR-10-C style, comma-separated; `all`: every one; empty: off), "
        "at each of `corruption-severities`: metrics `acc-corrupt-<name>-<severity>`",
        parse=parse_corruptions,
        allowed="`all`, or names from " + ", ".join(f"`{n}`" for n in CORRUPTIONS),
    )
    corruption_severities: tuple[int, ...] = hp(
        (1, 2, 3, 4, 5),
        "severities evaluated for each of `corruptions`",
        parse=parse_severities,
        allowed="comma-separated numbers from 1 to 5",
    )
    corruption_eval_size: int = hp(
        0,
        "`corruptions`: evaluate them on a seeded subset of this many of each client's "
        "test samples (0: all); each (corruption, severity) costs one pass over it",
        low=0,
    )
    seed: int = hp(
        0, "one seed for partition, sampling, init and training: same seed, same metrics", low=0, high=2**31 - 1
    )
    device: str = hp(
        "auto",
        "where clients train, and FedAMP's and HeurFedAMP's server products when the server has a GPU (any value but "
        "`cpu`); `auto`: CUDA when present",
        choices=DEVICES,
    )
    client_threads: int = hp(1, "torch threads per simulated client", low=1, high=256)
    max_client_samples: int = hp(
        100_000,
        "a client declaring more training or test samples at the handshake is "
        "refused; no reply may count more samples than its client declared",
        low=1,
    )
    takeover_after: float = hp(
        120.0,
        "deployment: seconds a partition's node must have been gone before another "
        "node may take the partition over (a replaced device); until then its claim is "
        "refused",
        low=0.0,
        high=1e7,
    )
    takeover: str = hp(
        "operator",
        "deployment: who lets a gone node's partition go to another node (in a running or a resumed run): "
        "`operator` (`pflower allow-takeover RUN_DIR PARTITION --node NODE`, one take-over per consent) or "
        "`after-timeout` (any registered node, after `takeover-after` seconds)",
        choices=("operator", "after-timeout"),
    )
    allow_unprotected: bool = hp(
        False,
        "deployment: start even with none of the keys that protect the algorithm on (robust-aggregation or "
        "max-weight-ratio for the averaging ones, max-weight-ratio for DM-PFL, FedDST and DapperFL, "
        "max-update-ratio for FedAMP and HeurFedAMP; refused otherwise: one device could steer the models); "
        "simulations and the in-process engine never ask",
    )
    max_weight_ratio: float = hp(
        0.0,
        "deployment: a client counts at most this many times the median training-sample count the other clients "
        "declared at the handshake in every sample-weighted average (FedAvg, DM-PFL's and FedDST's votes, FLIU's "
        "n, ...), so a client inflating its count gains little; the deployment recipes set 4; 0: no cap (studies: "
        "honest quantity-skewed partitions exceed 4x the median)",
        low=0.0,
    )
    max_update_ratio: float = hp(
        0.0,
        "deployment: in every weighted average (FedAvg family, FLIU, DM-PFL's and FedDST's values, DapperFL) an "
        "update (upload - the model the client started from, L2 over what it uploaded) is shortened to at most this "
        "many times the median norm of the round's other updates, so one boosted update cannot replace the model; "
        "in FedAMP and HeurFedAMP the update is measured from the client's previous upload, before it enters the "
        "others' u_i; the recipes set 3; 0: no bound",
        low=0.0,
        high=1e6,
    )
    messages_in_flight: int = hp(
        64,
        "the most messages the server has out at once when handshaking, pre-training or "
        "evaluating more clients than this: a sliding window, each freed slot refilled "
        "(server memory bounded at thousands of clients; a message unanswered "
        "`round-timeout` seconds after it was sent is given up)",
        low=1,
    )
    round_timeout: float = hp(
        600.0,
        "seconds to wait for each reply, from when the message was sent (in-process engine: from when a worker "
        "took it up, not while it waited for one; the run's first handshake waits at least 120 s, counted again from "
        "each node's answer); a round goes on with those that arrived",
        low=0.0,
        low_open=True,
    )
    drop_rate: float = hp(
        0.0,
        "simulation: this fraction of each round's training clients fails (seeded); the round goes on without them",
        low=0.0,
        high=0.95,
    )
    straggler_rate: float = hp(
        0.0,
        "simulation: this fraction of each round's training clients (others than the "
        "dropped ones) trains but answers after the round timeout; their replies are not "
        "used",
        low=0.0,
        high=0.95,
    )
    dirty_clients: float = hp(
        0.0,
        "this fraction of the clients (seeded) has `dirty-fraction` of its training labels flipped to another class",
        low=0.0,
        high=1.0,
    )
    dirty_fraction: float = hp(0.0, "fraction of a dirty client's training labels flipped", low=0.0, high=1.0)
    robust_aggregation: str = hp(
        "none",
        "weight-averaging algorithms: `clip` (updates longer than "
        "`robust-clip-norm` are shortened to it), `trimmed-mean` (coordinate-wise, "
        "`robust-trim` of the values dropped at each end) or `median` (coordinate-wise) "
        "instead of the sample-weighted average",
        choices=ROBUST_METHODS,
    )
    robust_clip_norm: float = hp(
        0.0, "`clip`'s bound on an update's L2 norm; 0: the median update norm of the round", low=0.0
    )
    robust_trim: float = hp(
        0.2,
        "`trimmed-mean`: fraction of each coordinate's values dropped at each end",
        low=0.0,
        high=0.5,
        high_open=True,
    )
    dp: str = hp(
        "none",
        "client-level differential privacy: `central` (the server samples each client with probability "
        "`fraction-train` (Poisson), clips each update to `dp-clip-norm`, averages over the clients a round plans and "
        "adds Gaussian noise; weight-averaging algorithms but FLIU), "
        "`local` (each client clips and noises its own update before sending), `distributed` (with `secagg`: each "
        "client clips its update and adds its share of the noise, the server sees only the noised sum) or `none`; "
        "every round logs epsilon at `dp-delta` (docs/privacy.md)",
        choices=DP_MODES,
    )
    dp_clip_norm: float = hp(
        1.0, "`dp`: the bound on each client's update (L2 over what it sends)", low=0.0, low_open=True
    )
    dp_noise_multiplier: float = hp(
        0.0,
        "`dp`: noise std over the clip bound (z); 0 with `dp-target-epsilon` set: solved before the run",
        low=0.0,
    )
    dp_target_epsilon: float = hp(
        0.0,
        "`dp`: the epsilon at `dp-delta` after the run's rounds that sets the noise multiplier (0: off)",
        low=0.0,
    )
    dp_noise_seed: int = hp(
        0,
        "`dp`: 0 draws the noise (and central DP's sample) from a secret the server makes at the start (kept only "
        "in its checkpoint); another value derives them from that number: repeatable studies, but no privacy against "
        "anyone who knows it",
        low=0,
    )
    dp_delta: float = hp(
        1e-5, "`dp`: the delta of the (epsilon, delta) guarantee", low=0.0, high=1.0, low_open=True, high_open=True
    )
    dp_colluding_clients: int = hp(
        0,
        "`dp` = distributed: the epsilon holds even when this many of a round's clients collude with the server "
        "(tell it their noise, or add none): each client adds the noise that the others alone carry the noise "
        "multiplier; fewer than a round's clients",
        low=0,
    )
    dp_adaptive_clip: bool = hp(
        False,
        "`dp` = central: the clip bound follows the `dp-clip-quantile` of the update norms (Andrew et al. 2021), "
        "starting at `dp-clip-norm`",
    )
    dp_clip_quantile: float = hp(
        0.5,
        "`dp-adaptive-clip`: the share of updates the bound aims to leave unclipped",
        low=0.0,
        high=1.0,
        low_open=True,
        high_open=True,
    )
    dp_clip_learning_rate: float = hp(
        0.2, "`dp-adaptive-clip`: the geometric step of the bound per round", low=0.0, low_open=True
    )
    dp_clip_band: float = hp(
        10.0,
        "`dp-adaptive-clip`: the bound stays within this factor of `dp-clip-norm` either way (a colluding majority "
        "cannot take it past; docs/robustness.md); 1 keeps it fixed",
        low=1.0,
    )
    dp_local_metrics: str = hp(
        "withhold",
        "`dp` = local: `withhold` (the clients report no statistic of their data: no loss, sample or step counts, "
        "FLOPs or evaluation, so the run evaluates nothing) or `report` (a simulation study's measurements, reported "
        "without noise and outside the epsilon; a device with a `dp-noise-floor` refuses it)",
        choices=("withhold", "report"),
    )
    secagg: str = hp(
        "none",
        "secure aggregation: `secaggplus` (SecAgg+, Bell et al. 2020: the server learns only the sum of the round's "
        "uploads, sample counts and loss included; docs/privacy.md) or `none`",
        choices=SECAGG_MODES,
    )
    secagg_num_shares: float = hp(
        1.0,
        "`secaggplus`: each client's neighbours (itself included) that hold shares of its secrets: a fraction of the "
        "round's clients in (0, 1], or a count of at least 3",
        low=0.0,
        low_open=True,
    )
    secagg_reconstruction_threshold: float = hp(
        0.67,
        "`secaggplus`: shares that rebuild a secret: a fraction of the shares in (0, 1], or a count; it must be more "
        "than half of the shares",
        low=0.0,
        low_open=True,
    )
    secagg_clipping_range: float = hp(
        8.0,
        "`secaggplus`: each weight-scaled value is clipped to [-range, range] before quantization",
        low=0.0,
        low_open=True,
    )
    secagg_quantization_range: int = hp(4194304, "`secaggplus`: values are quantized to integers in [0, range]", low=2)
    secagg_modulus_range: int = hp(
        4294967296,
        "`secaggplus`: the masks' modulus, a power of two up to 2**64; it must exceed the round's clients x "
        "`secagg-quantization-range` (2**32 sends 4 bytes a value, more sends 8)",
        low=2,
    )
    secagg_max_weight: float = hp(
        1000.0,
        "`secaggplus`: the sample count that weighs fully; a client with more counts as this many (the round's "
        "record counts how many were capped)",
        low=0.0,
        low_open=True,
    )
    attack_clients: float = hp(
        0.0,
        "simulation: this fraction of the clients (seeded) attacks by model "
        "replacement: trains on labels shifted by one class and uploads "
        "w + `attack-boost` (w_local - w)",
        low=0.0,
        high=1.0,
    )
    attack_boost: float = hp(
        10.0,
        "the attackers' update scale (model replacement: about the number of clients averaged; -1: the update "
        "reversed, as long as an honest one: colluders inside the honest spread); at least 1 in size",
        low=-1e4,
        high=1e4,
    )
    attack_walk: float = hp(
        0.0,
        "simulation: the attackers walk instead of boosting: each round they upload the model they received plus "
        "this many times their own update's length along one fixed seeded direction (the same for all), a step "
        "the per-round bound lets through (0: off)",
        low=0.0,
        high=100.0,
    )
    attack_declare: int = hp(
        0,
        "simulation: the attackers also declare this many training samples at the handshake and in every reply, "
        "to outweigh the others (0: their true count; at most `max-client-samples`, or the handshake is refused)",
        low=0,
    )
    stages: bool = hp(False, "FLIU's stage metrics (G, L1, L2) for the clients of each round")
    stage_test_size: int = hp(2000, "size of the seeded pooled-test subset for the stages' Acc(G) (0: all)", low=0)
    rho_eps: tuple[float, ...] = hp(
        (0.9, 0.95),
        "thresholds eps of the stages' rho_eps",
        parse=parse_degrees,
        allowed="comma-separated numbers in [0, 1]",
    )
    results_dir: str = hp("", "where results go (empty: `$PFL_RESULTS_DIR`, else `~/pflower-results`)")
    run_name: str = hp(
        "",
        "the run folder's name (default `algorithm-dataset-timestamp`)",
        parse=_folder_name,
        allowed="letters, digits, `.`, `_`, `-`",
    )
    checkpoint_every: int = hp(
        1,
        "write the server checkpoint every N rounds (and after the last); 0: never. "
        "FedAMP/FedFomo checkpoints hold every client's model (100 clients x the MNIST CNN: "
        "0.67 GB, about 5 s to write on a 2-core machine): raise N for such runs",
        low=0,
    )
    resume: str = hp("", "a run folder to continue from its checkpoint (same run config; `num-rounds` may grow)")
    client_state_dir: str = hp(
        "auto",
        "simulation: where clients keep their state (personal weights, masks, "
        "algorithm state): `auto`: in files in the run folder (`client-state/`), so memory "
        "grows with one round's clients, not with all, and a resumed run continues them "
        "(the in-process engine holds them in shared memory between messages, up to "
        "PFLOWER_STATE_MEMORY_MB, by default a quarter of the memory and at least 2048, and "
        "writes them for each checkpoint); "
        "`memory`: in the simulation's memory; or a folder (absolute path). On a device the "
        "node config's `state-dir` does this",
    )
    message_digests: bool = hp(
        False,
        "write the digest (Flower's content-addressed object id) of every message sent "
        f"and every reply received to `{MESSAGES_FILE}` in the run folder: two runs (on two "
        "engines, or at two commits) compared message by message",
    )
    tensorboard: bool = hp(
        False,
        "also write every round's metrics (and the run config, and the final summary) as TensorBoard scalars to "
        "`tensorboard/` in the run folder (needs the `tracking` extra; docs/tracking.md)",
    )
    mlflow_uri: str = hp(
        "",
        "also log the run config and every round's metrics (step = round) to MLflow: a tracking server "
        "(`http(s)://...`) or a local folder (an absolute path or a `file:` URI); experiment: the results folder's "
        "name, run: the run folder's; empty: off (needs the `tracking` extra; docs/tracking.md)",
        parse=_mlflow_uri,
        allowed="empty, an absolute path, `file:`, `http(s)://` or `sqlite:` URI",
    )
    params: Any = None
    algorithm_keys: dict[str, Any] = field(default_factory=dict)

    @property
    def client_state_on_disk(self) -> bool:
        """Whether simulated clients keep their state in files (client-state-dir other than `memory`)."""
        return self.client_state_dir != "memory"

    @property
    def resolved_data_dir(self) -> Path:
        """Data folder: the config value, else $PFL_DATA_DIR, else ~/.cache/pflower/data."""
        raw = self.data_dir or os.environ.get("PFL_DATA_DIR", "")
        return Path(raw).expanduser() if raw else Path.home() / ".cache" / "pflower" / "data"

    def _section(self, cls: type[S], **computed: Any) -> S:
        """A section of the config: each field the key of the same name, or its `computed` value."""
        return cls(**{f.name: computed[f.name] if f.name in computed else getattr(self, f.name) for f in fields(cls)})

    @property
    def data(self) -> DataSettings:
        """The data section: what the data code reads (common/data/settings.py)."""
        split = self._section(SplitSettings, data_dir=str(self.resolved_data_dir))
        return self._section(DataSettings, split=split)

    @property
    def training(self) -> TrainingSettings:
        """The training section (common/sections.py)."""
        return self._section(TrainingSettings)

    @property
    def evaluation(self) -> EvaluationSettings:
        """The evaluation section (common/sections.py)."""
        return self._section(EvaluationSettings, domains=self.partition == "domains")

    @property
    def faults(self) -> FaultSettings:
        """The simulated faults section (common/sections.py)."""
        return self._section(FaultSettings)

    @property
    def secagg_params(self) -> SecAggParams:
        """SecAgg+'s parameters (common/secagg/params.py): a share or threshold above 1 is a count."""

        def count_or_fraction(value: float) -> int | float:
            return int(value) if value > 1 else float(value)

        return SecAggParams(
            num_shares=count_or_fraction(self.secagg_num_shares),
            reconstruction_threshold=count_or_fraction(self.secagg_reconstruction_threshold),
            clipping_range=self.secagg_clipping_range,
            quantization_range=self.secagg_quantization_range,
            modulus_range=self.secagg_modulus_range,
            max_weight=self.secagg_max_weight,
        )

    @property
    def privacy(self) -> PrivacySettings:
        """The differential-privacy section (common/sections.py)."""
        return self._section(PrivacySettings)

    @property
    def output(self) -> OutputSettings:
        """The output section (common/sections.py)."""
        return self._section(OutputSettings, results_dir=self.resolved_results_dir)

    @property
    def resolved_results_dir(self) -> Path:
        """Results folder: the config value, else $PFL_RESULTS_DIR, else ~/pflower-results."""
        raw = self.results_dir or os.environ.get("PFL_RESULTS_DIR", "")
        return (Path(raw).expanduser() if raw else Path.home() / "pflower-results").resolve()

    def params_as(self, kind: type[P]) -> P:
        """The algorithm's hyperparameters, checked to be of the dataclass `kind` (a typed view for its halves)."""
        if not isinstance(self.params, kind):
            raise TypeError(
                f"algorithm {self.algorithm!r} has parameters {type(self.params).__name__}, not {kind.__name__}"
            )
        return self.params

    @property
    def robust_rule(self) -> RobustRule:
        """The aggregation rule of `robust-aggregation` with its settings."""
        return RobustRule(self.robust_aggregation, self.robust_clip_norm, self.robust_trim)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with run-config (dashed) key names, for config.json."""
        return {**as_dict(self), **self.algorithm_keys}

    def settings_dict(self) -> dict[str, Any]:
        """`to_dict` without the keys only other algorithms read: what defines this run (a changed default of
        DM-PFL's keys does not change a FedAvg run)."""
        own = {info.key for info in describe(type(self.params))} if self.params is not None else set()
        foreign = {info.key for cls in param_classes() for info in describe(cls)} - own
        return {key: value for key, value in self.to_dict().items() if key not in foreign}


def key_infos() -> dict[str, KeyInfo]:
    """Every run-config key (general keys, then the algorithms' keys) with its declaration."""
    infos = {info.key: info for info in describe(RunConfig)}
    for cls in param_classes():
        infos.update({info.key: info for info in describe(cls) if info.key not in infos})
    return infos


def known_keys() -> dict[str, Any]:
    """Every run-config key (general and algorithm keys) with its default."""
    return {key: info.default for key, info in key_infos().items()}


def unknown_key_message(key: str, known: Mapping[str, Any] | None = None) -> str:
    """One line for a run-config key that does not exist: the nearest known key, if one is close, and where every
    key is listed (not the whole list: there are over a hundred)."""
    close = difflib.get_close_matches(key, sorted(known if known is not None else known_keys()), n=1, cutoff=0.6)
    hint = f": did you mean '{close[0]}'?" if close else ""
    return f"unknown run-config key '{key}'{hint} (every key: `pflower keys`, or docs/configuration.md)"


def _check_gradient_pull(cfg: RunConfig, params: Any) -> None:
    """FedProx's and Ditto's pulls are gradient terms (as their papers): SGD with momentum beta diverges on them once
    lr * coefficient >= 2 (1 + beta) (the heavy-ball stability bound on a quadratic)."""
    pulls = {FedProxParams: ("proximal-mu", "proximal_mu"), DittoParams: ("ditto-lambda", "ditto_lambda")}
    for cls, (key, attr) in pulls.items():
        if isinstance(params, cls) and cfg.optimizer == "sgd":
            coefficient, bound = float(getattr(params, attr)), 2.0 * (1.0 + cfg.momentum)
            if cfg.lr * coefficient >= bound:
                raise ConfigError(
                    f"run-config 'lr' x '{key}' = {cfg.lr:g} x {coefficient:g} = "
                    f"{cfg.lr * coefficient:g}: SGD on the (coefficient/2)||w - w_ref||^2 term diverges "
                    f"at {bound:g} (2 (1 + momentum)) or more; lower one of them"
                )
    if isinstance(params, PFedMeParams):
        inner, bound = params.pfedme_personal_lr * params.pfedme_lambda, 2.0 * (1.0 + cfg.momentum)
        if cfg.optimizer == "sgd" and inner >= bound:
            raise ConfigError(
                f"run-config 'pfedme-personal-lr' x 'pfedme-lambda' = {inner:g}: pFedMe's inner SGD steps on "
                f"(lambda/2)||theta - w_i||^2 diverge at {bound:g} (2 (1 + momentum)) or more; lower one of them"
            )
        if cfg.lr * params.pfedme_lambda >= 2.0:
            raise ConfigError(
                f"run-config 'lr' x 'pfedme-lambda' = {cfg.lr * params.pfedme_lambda:g}: pFedMe's outer step "
                "w_i <- w_i - lr lambda (w_i - theta) diverges at 2 or more; lower one of them"
            )


def _check_secagg(cfg: RunConfig, algorithm: str) -> None:
    """ConfigError when `secagg` = secaggplus cannot keep its promise (the server learns only the sum) here."""
    if cfg.secagg == "none":
        return
    if algorithm in SECAGG_REFUSED:
        raise ConfigError(
            f"run-config 'secagg' = '{cfg.secagg}' cannot apply to '{algorithm}': {SECAGG_REFUSED[algorithm]}"
        )
    hidden = "secure aggregation hides each client's upload, so the server cannot"
    for key, on, why in (
        (
            "dp",
            cfg.dp in ("central", "local"),
            f"{hidden} clip or noise one; 'dp' = 'distributed' has each client add its share of the noise",
        ),
        ("robust-aggregation", cfg.robust_aggregation != "none", f"{hidden} clip, trim or rank one"),
        ("max-update-ratio", cfg.max_update_ratio > 0, f"{hidden} compare one with the others"),
        ("max-weight-ratio", cfg.max_weight_ratio > 0, "the clients' sample counts travel inside the masked sum"),
    ):
        if on:
            raise ConfigError(f"run-config '{key}' with 'secagg' = '{cfg.secagg}': {why}")
    try:
        cfg.secagg_params.check()
    except ValueError as exc:
        raise ConfigError(f"run-config secagg keys: {exc}") from None


def _check_distributed_dp(cfg: RunConfig, algorithm: str) -> None:
    """ConfigError when `dp` = distributed cannot hold here (common/methods/distributed_dp.py)."""
    if cfg.secagg == "none":
        raise ConfigError(
            "run-config 'dp' = 'distributed': each client adds only a share of the noise, which hides its update only "
            "inside a secure sum: set 'secagg' = 'secaggplus'"
        )
    if algorithm in DISTRIBUTED_DP_REFUSED:
        why = DISTRIBUTED_DP_REFUSED[algorithm]
        raise ConfigError(f"run-config 'dp' = 'distributed' cannot apply to '{algorithm}': {why}")
    if cfg.dp_adaptive_clip:
        raise ConfigError(
            "run-config 'dp-adaptive-clip' is central DP's: the server adapts the bound from a noised count of the "
            "updates it clips; under 'distributed' it sees none of them"
        )


def _check_dp(cfg: RunConfig, algorithm: str, averaging: list[str]) -> None:
    """ConfigError when the run's `dp` settings cannot give the guarantee they promise."""
    if cfg.dp_colluding_clients and cfg.dp != "distributed":
        raise ConfigError(
            "run-config 'dp-colluding-clients' is distributed DP's (each client's share of the noise); under "
            f"'dp' = '{cfg.dp}' no client adds noise the others count on"
        )
    if cfg.dp == "none":
        return
    if algorithm == "local":
        raise ConfigError(
            "run-config 'dp' with algorithm 'local': nothing leaves the clients, there is nothing to noise"
        )
    if SPECS[algorithm].dp_refusal:
        raise ConfigError(f"run-config 'dp' cannot apply to '{algorithm}': {SPECS[algorithm].dp_refusal}")
    if cfg.dp == "distributed":
        _check_distributed_dp(cfg, algorithm)
    if cfg.dp == "central" and algorithm in CENTRAL_DP_REFUSED:
        raise ConfigError(
            f"run-config 'dp' = '{cfg.dp}' cannot apply to '{algorithm}': {CENTRAL_DP_REFUSED[algorithm]}"
        )
    on_global_mask = algorithm in CENTRAL_DP_ON_GLOBAL_MASK  # sparse: DP on the positions each upload carries
    recovered = algorithm in CENTRAL_DP_RECOVERED  # pruned: DP on the updates the server recovers
    if not (on_global_mask or recovered) and (not SPECS[algorithm].averages_models or algorithm in CENTRAL_DP_REFUSED):
        supported = ", ".join(a for a in averaging if a not in CENTRAL_DP_REFUSED)
        supported += ", " + ", ".join(CENTRAL_DP_ON_GLOBAL_MASK + CENTRAL_DP_RECOVERED)
        raise ConfigError(
            f"run-config 'dp' = '{cfg.dp}' is built for the algorithms whose server averages what the clients upload "
            f"({supported}), not yet for '{algorithm}'"
        )
    if (cfg.dp_noise_multiplier > 0) == (cfg.dp_target_epsilon > 0):
        raise ConfigError(
            "run-config 'dp' needs exactly one of 'dp-noise-multiplier' (the noise) and 'dp-target-epsilon' (the "
            f"budget the noise is solved for), got {cfg.dp_noise_multiplier:g} and {cfg.dp_target_epsilon:g}"
        )
    if cfg.dp == "local" and cfg.dp_adaptive_clip:
        raise ConfigError(
            "run-config 'dp-adaptive-clip' is central DP's: the server adapts the bound from a noised count of the "
            "updates it clips; under 'local' each client clips its own"
        )
    if cfg.dp == "local" and cfg.dp_target_epsilon > 0:
        raise ConfigError(
            "run-config 'dp' = 'local': each client noises its own upload and must not take its noise from the "
            "server, so give 'dp-noise-multiplier' (docs/privacy.md: the epsilon it reaches), not 'dp-target-epsilon'"
        )
    if cfg.dp == "central" and cfg.robust_aggregation in ("trimmed-mean", "median"):
        raise ConfigError(
            f"run-config 'dp' with robust-aggregation '{cfg.robust_aggregation}': a coordinate-wise rule has no "
            "bounded sensitivity to one client; use 'clip' with a fixed robust-clip-norm (it clips first, then DP "
            "clips and adds noise) or 'none'"
        )
    # Central DP's guarantee needs each client's clipped update to depend on that client alone: a bound taken from
    # the round's other updates lets one client's presence rescale everyone else's (sensitivity above C).
    if cfg.dp == "central" and cfg.robust_aggregation == "clip" and cfg.robust_clip_norm <= 0:
        raise ConfigError(
            "run-config 'dp' = 'central' with robust-aggregation 'clip' and robust-clip-norm 0 (the round's median "
            "norm): one client's presence would move the others' bound, so DP's sensitivity would not hold; give a "
            "fixed robust-clip-norm"
        )
    if cfg.dp == "central" and cfg.max_update_ratio > 0:
        raise ConfigError(
            "run-config 'dp' = 'central' with max-update-ratio > 0: the peer bound is a multiple of the other "
            "updates' median norm, so one client's presence would rescale the others and DP's sensitivity would not "
            "hold; under central DP the clip to dp-clip-norm bounds every update (set max-update-ratio 0)"
        )


def parse_run_config(raw: Mapping[str, Any]) -> RunConfig:
    """Validate a Flower run config into a RunConfig; raise ConfigError naming the first bad key."""
    known = known_keys()
    for key in raw:
        if key not in known:
            raise ConfigError(unknown_key_message(str(key), known))
    algorithm = choice("algorithm", raw.get("algorithm", "fedavg"), sorted(SPECS))
    algorithm_keys: dict[str, Any] = {}
    params: Any = None
    for cls in param_classes():
        parsed: Any = parse_fields(cls, raw)
        algorithm_keys.update(as_dict(parsed))
        if cls is SPECS[algorithm].params:
            params = parsed
    cfg = parse_fields(RunConfig, raw, params=params, algorithm_keys=algorithm_keys)
    averaging = sorted(name for name, spec in SPECS.items() if spec.averages_models)
    if cfg.robust_aggregation != "none" and not SPECS[algorithm].averages_models:
        raise ConfigError(
            f"run-config 'robust-aggregation' applies to the weight-averaging algorithms ({', '.join(averaging)}), "
            f"not to '{algorithm}'"
        )
    attacked = sorted(name for name, spec in SPECS.items() if spec.averages_models or spec.mixes_models)
    if cfg.attack_clients > 0 and algorithm not in attacked:
        raise ConfigError(
            f"run-config 'attack-clients' applies to the algorithms whose server averages or mixes whole uploaded "
            f"models ({', '.join(attacked)}), not to '{algorithm}'"
        )
    if cfg.attack_walk > 0 and cfg.attack_clients <= 0:
        raise ConfigError("run-config 'attack-walk' makes the attackers walk: set 'attack-clients' > 0 too")
    if cfg.attack_walk > 0 and SPECS[algorithm].shares != "all":
        raise ConfigError(
            f"run-config 'attack-walk' walks the whole model; {algorithm} shares only part of it "
            f"({SPECS[algorithm].shares})"
        )
    if cfg.max_update_ratio > 0 and not SPECS[algorithm].bounds_updates:
        bounded = sorted(name for name, spec in SPECS.items() if spec.bounds_updates)
        raise ConfigError(
            f"run-config 'max-update-ratio' applies to the algorithms that average uploads ({', '.join(bounded)}), "
            f"not to '{algorithm}'"
        )
    if abs(cfg.attack_boost) < 1:
        raise ConfigError(
            f"run-config 'attack-boost' = {cfg.attack_boost:g} must be at least 1 in size (or -1 and below)"
        )
    _check_gradient_pull(cfg, params)
    _check_dp(cfg, algorithm, averaging)
    _check_secagg(cfg, algorithm)
    if cfg.stop_patience > 0 and not 0 < cfg.eval_every <= cfg.stop_patience:
        raise ConfigError(
            f"run-config 'stop-patience' = {cfg.stop_patience} needs an evaluation within every {cfg.stop_patience} "
            f"rounds: 'eval-every' = {cfg.eval_every} must be between 1 and it"
        )
    if cfg.model == "auto" and SPECS[algorithm].shares == "no-norm":  # FedBN: the dataset's model with batch norm
        cfg = replace(cfg, model=AUTO_MODEL[cfg.dataset] + "-bn")
    return cfg


def due(server_round: int, every: int, num_rounds: int) -> bool:
    """Whether a round-periodic task (checkpoint, evaluation) runs: every `every` rounds (0: never) and after the
    last round."""
    return every > 0 and (server_round % every == 0 or server_round == num_rounds)
