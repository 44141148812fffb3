"""One spec per algorithm: its name, its hyperparameters (typed, with defaults, ranges and help) and the extra
evaluation rows it reports. Server and client registries, the run-config parser, pyproject.toml and the docs'
tables all read from here.

Adding an algorithm: a hyperparameter dataclass (if it has keys of its own) and one `AlgorithmSpec` entry
naming its server module:class (in server_app/strategies/) and client module:class (in client_app/algorithms/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module

from common.hparams import ConfigError, hp, number


@dataclass(frozen=True)
class EvalRow:
    """An accuracy an algorithm reports beside its main model, as metrics '<prefix>acc-shift-<d>'."""

    prefix: str
    label: str  # row label in summary.md
    suffix: str  # appended to the algorithm's name in comparison tables
    required: bool  # a reply without it is rejected (else the row is kept when present)
    diagnostic: bool = False  # a share of samples, not a model's accuracy: in summary.md, not in model comparisons


PLUS = EvalRow("plus-", "DM-PFL+", "+", required=True)
# DM-PFL+'s selector read otherwise (issue of calibration: docs/algorithms.md), reported by every DM-PFL evaluation
PLUS_LOGITS = EvalRow("selector-logits-", "DM-PFL+, similarity on logits", "+ (logits)", required=False)
PLUS_CALIBRATED = EvalRow("selector-calibrated-", "DM-PFL+, temperature-calibrated", "+ (calibrated)", required=False)
# where theta_c and theta_g disagree, as shares of all samples (DM-PFL+'s selector as configured)
DISAGREE = EvalRow("disagree-", "samples where theta_c and theta_g disagree", " (disagree)", False, True)
DISAGREE_TO_C = EvalRow("disagree-to-c-", "... DM-PFL+ takes theta_c there", " (disagree, to c)", False, True)
DISAGREE_C_RIGHT = EvalRow("disagree-c-right-", "... theta_c is right there", " (disagree, c right)", False, True)
DISAGREE_G_RIGHT = EvalRow("disagree-g-right-", "... theta_g is right there", " (disagree, g right)", False, True)
SELECTOR_ROWS = (PLUS_LOGITS, PLUS_CALIBRATED, DISAGREE, DISAGREE_TO_C, DISAGREE_C_RIGHT, DISAGREE_G_RIGHT)
GLOBAL = EvalRow("global-", "global model", " (global model)", required=True)
CLOUD = EvalRow("cloud-", "cloud model u_i", " (cloud model)", required=False)
FINETUNED = EvalRow("finetuned-", "after fine-tuning", " (fine-tuned)", required=True)  # held-out clients' 2nd row


@dataclass(frozen=True)
class NoParams:
    """An algorithm without keys of its own."""


@dataclass(frozen=True)
class FedProxParams:
    """FedProx's proximal coefficient (sent to clients in every training message)."""

    proximal_mu: float = hp(
        0.05,
        "FedProx's mu: clients add (mu/2)||w - w_global||^2 (with SGD, lr x mu < "
        "2 (1 + momentum) or it diverges: refused)",
        low=0.0,
    )


@dataclass(frozen=True)
class SparseParams:
    """Keys of every algorithm with a sparse global model."""

    sparsity: float = hp(
        0.5, "fraction of zeros S of the global model (ERK layer densities)", low=0.0, high=1.0, high_open=True
    )


SIMILARITIES = ("softmax", "logits")  # what Alg. 4's cosine similarity is taken on (the paper: softmax outputs)
CALIBRATIONS = ("none", "temperature")  # DM-PFL+'s selector on the models as they are (the paper), or calibrated
PHASE_LAYOUTS = ("thirds", "halves")
PHASE3_MODES = ("sampled", "all", "all-reset")
BASE_ENTROPY_INPUTS = ("train", "unshifted-test")


@dataclass(frozen=True)
class DMPFLParams(SparseParams):
    """DM-PFL's schedule and mask readjustment (DM-PFL [KDD 2023] Sec. 3.3, Alg. 1-3)."""

    iterations: int = hp(3, "cycles of the three phases (0: phase 1 only)", low=0, high=10_000)
    readjust_ratio: float = hp(
        0.05, "initial prune/regrow fraction alpha_s of m_c (cosine decay over the phase-1 rounds)", low=0.0, high=1.0
    )
    min_vote_fraction: float = hp(
        0.3, "a position enters m_g only if more than this fraction of the round's clients kept it", low=0.0, high=1.0
    )
    phases: str = hp(
        "halves",
        "how a cycle's rounds split: `halves` (the paper's two-phased pipeline, Sec. 3.3.1: phases 1 and 2 in equal "
        "halves, then one phase-3 round), `thirds` (phases 1, 2, 3 in equal thirds, Sec. 4.3.2's other reading)",
        choices=PHASE_LAYOUTS,
        key="dmpfl-phases",
    )
    phase3: str = hp(
        "all-reset",
        "who refines personal weights in a phase-3 round: `sampled` (the round's sample, w_c kept), `all` (every "
        "client, w_c kept), `all-reset` (Algorithm 3 as written: every client, its personal-only weights reset to 0 "
        "at the cycle's first phase-3 round: the default)",
        choices=PHASE3_MODES,
        key="dmpfl-phase3",
    )
    base_entropy: str = hp(
        "train",
        "DM-PFL+'s base entropies BE(theta_c), BE(theta_g) (Alg. 4): mean entropy on the client's `train` data, or "
        "on its `unshifted-test` inputs (the paper's 'inputs not shifted'; labels unused)",
        choices=BASE_ENTROPY_INPUTS,
        key="dmpfl-base-entropy",
    )
    select_calibration: str = hp(
        "none",
        "DM-PFL+'s selector (Alg. 4) on the models as they are (`none`, the paper) or on each model's logits over a "
        "temperature fitted per client on its training data (`temperature`, this project's extension); both are "
        "reported in every evaluation",
        choices=CALIBRATIONS,
        key="dmpfl-select-calibration",
    )
    select_similarity: str = hp(
        "softmax",
        "Alg. 4's cosine similarity on the softmax outputs (`softmax`, the paper's reading) or on the `logits`",
        choices=SIMILARITIES,
        key="dmpfl-select-similarity",
    )
    partial_download: bool = hp(
        True,
        "phases 1 and 3 send a client whose m_c the server knows (from its last "
        "phase-1 upload) only w_g on m_g AND m_c, the part it uses (same results, fewer bytes; "
        "off with `stages`, which evaluate the whole theta_g)",
    )


@dataclass(frozen=True)
class FedDSTParams(SparseParams):
    """FedDST's mask readjustment."""

    readjust_interval: int = hp(10, "readjust the mask every N rounds", low=1)
    dst_readjust_ratio: float = hp(0.01, "fraction of the mask pruned and regrown at a readjustment", low=0.0, high=1.0)


def _minus_one_or_unit(meaning: str) -> Callable[[str, object], float]:
    """A key parser for values that are -1 (`meaning`, e.g. "off") or lie in [0, 1]."""

    def parse(key: str, value: object) -> float:
        parsed = number(key, value, float)
        if parsed != -1.0 and not 0.0 <= parsed <= 1.0:
            raise ConfigError(f"run-config '{key}' = {parsed} must be -1 ({meaning}) or lie in [0, 1]")
        return parsed

    return parse


@dataclass(frozen=True)
class AMPParams:
    """Keys shared by FedAMP and HeurFedAMP (FedAMP [arXiv:2007.03797] Sec. 4, Alg. 1-2)."""

    fedamp_alpha: float = hp(1.0, "alpha_0 of the attention step", low=0.0, low_open=True)
    fedamp_lambda: float = hp(
        1e-4,
        "lambda: clients' proximal coefficient is lambda / alpha_k (the defaults give "
        "the paper's beta_0 = alpha/lambda = 1e4)",
        low=0.0,
        low_open=True,
    )
    fedamp_decay: float = hp(
        0.1, "alpha_k = alpha_0 * decay^floor((k-1)/decay-every)", low=0.0, high=1.0, low_open=True
    )
    fedamp_decay_every: int = hp(30, "rounds between two decays of alpha_k", low=1)
    pretrain_epochs: int = hp(
        1, "local epochs every client trains from the common initialization before round 1", low=0, high=10_000
    )
    pretrain_when: str = hp(
        "round-0",
        "round-0: every client pre-trains in a round 0 before round 1 (the spec's reading); first-sampled: a client "
        "pre-trains the first round it is sampled and its model takes part in the attention from then on (not "
        "the paper's schedule: spreads round 0's work, every client's training, over the rounds)",
        choices=("round-0", "first-sampled"),
    )
    fedamp_attend: str = hp(
        "all",
        "all: attention over every client's latest model (the paper's algorithm); round: over the round's "
        "participants only, as PFLlib does (not the paper's algorithm; k^2 instead of k x clients model products, "
        "no Gram matrix of all clients)",
        choices=("all", "round"),
    )


@dataclass(frozen=True)
class FedAMPParams(AMPParams):
    """FedAMP's exp-distance attention."""

    fedamp_sigma: float = hp(100.0, "sigma of FedAMP's attention A'(t) = exp(-t/sigma)/sigma", low=0.0, low_open=True)
    fedamp_tau: float = hp(
        -1.0,
        "-1: Eq. 4 (xi_ii = 1 - the peers' sum); else a constant self-attention, as the "
        "paper's experiments (Appendix C.1): xi_ii = 1 - tau, the peers share tau in proportion to "
        "A'(||w_i - w_j||^2)",
        parse=_minus_one_or_unit("off"),
        allowed="-1 or [0.0, 1.0]",
    )


@dataclass(frozen=True)
class HeurFedAMPParams(AMPParams):
    """HeurFedAMP's cosine attention."""

    heurfedamp_sigma: float = hp(25.0, "HeurFedAMP's cosine scale", low=0.0)
    heurfedamp_tau: float = hp(0.95, "HeurFedAMP's weight tau of the other clients in u_i", low=0.0, high=1.0)


@dataclass(frozen=True)
class FLIUParams:
    """FLIU's gamma and server weighting (FLIU [arXiv:2510.24503] Sec. III)."""

    fliu_gamma: float = hp(
        -1.0,
        "-1: adaptive gamma_k(n_k) (Eq. 4); else a fixed gamma in [0, 1]",
        parse=_minus_one_or_unit("adaptive, Eq. 4"),
        allowed="-1 or [0.0, 1.0]",
    )
    fliu_weighting: str = hp("uniform", "server average of the round's models", choices=("uniform", "samples"))


@dataclass(frozen=True)
class FedFomoParams:
    """FedFomo's peer download and exploration."""

    fomo_models: int = hp(5, "peer models downloaded per client", low=1, high=64)
    fomo_epsilon: float = hp(0.3, "epsilon-greedy exploration of peers", low=0.0, high=1.0)
    fomo_epsilon_decay: float = hp(0.95, "per-round decay of epsilon", low=0.0, high=1.0, low_open=True)
    fomo_val_fraction: float = hp(
        0.2, "share of the training data held out to score peers", low=0.0, high=1.0, low_open=True, high_open=True
    )


def _ratios(key: str, value: object) -> tuple[float, ...]:
    items = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else []
    try:
        ratios = tuple(float(item) for item in items if str(item).strip() != "")
    except (TypeError, ValueError):
        ratios = ()
    if not ratios or any(not 0.0 <= r < 1.0 for r in ratios):
        raise ConfigError(f"run-config '{key}' = {value!r} must be comma-separated numbers in [0, 1)")
    return ratios


@dataclass(frozen=True)
class DapperFLParams:
    """DapperFL's device levels, model fusion pruning and domain adaptive regularization (DapperFL
    [arXiv:2412.05823] Sec. 3)."""

    dapperfl_ratios: tuple[float, ...] = hp(
        (0.0, 0.2, 0.4, 0.6, 0.8),
        "pruning ratio of each client, the list cycled over partition ids (device capability levels)",
        parse=_ratios,
        allowed="comma-separated numbers in [0, 1)",
    )
    dapperfl_alpha0: float = hp(0.9, "MFP: initial fusion factor alpha_0 (Eq. 2)", low=0.0, high=1.0)
    dapperfl_alpha_min: float = hp(0.1, "MFP: smallest fusion factor alpha_min", low=0.0, high=1.0)
    dapperfl_epsilon: float = hp(0.2, "MFP: alpha_t = max((1 - epsilon)^(t-1) alpha_0, alpha_min)", low=0.0, high=1.0)
    dapperfl_gamma: float = hp(0.01, "DAR: weight of mean ||z||^2 of the encoder output (Eq. 5)", low=0.0)
    dapperfl_mfp: bool = hp(True, "model fusion pruning (off: prune the received model by l1 directly)")
    dapperfl_dar: bool = hp(True, "domain adaptive regularization (off: cross-entropy only)")
    dapperfl_variant: str = hp(
        "paper",
        "paper: the paper's equations; official: the authors' public code as it runs (no fusion; every conv but "
        "the first, batch-norm scales and linear input columns zeroed in the full-shape model; the zeros "
        "uploaded and averaged, no Eq. 6; DAR gamma ||z|| in every epoch)",
        choices=("paper", "official"),
    )


@dataclass(frozen=True)
class DittoParams:
    """Ditto's pull of the personal model toward the global one."""

    ditto_lambda: float = hp(
        0.1,
        "lambda of the personal model's term (lambda/2)||v - w||^2 (with SGD, lr x lambda < "
        "2 (1 + momentum): refused otherwise)",
        low=0.0,
    )


@dataclass(frozen=True)
class APFLParams:
    """APFL's initial mixing weight."""

    apfl_alpha: float = hp(
        0.5, "initial alpha of the personalized model alpha v + (1 - alpha) w (then learned)", low=0.0, high=1.0
    )


@dataclass(frozen=True)
class ScaffoldParams:
    """SCAFFOLD's server learning rate (Karimireddy et al., ICML 2020, Algorithm 1)."""

    scaffold_server_lr: float = hp(
        1.0,
        "eta_g: the global model moves by eta_g times the round's mean update (the paper's runs: 1)",
        low=0.0,
        high=10.0,
        low_open=True,
    )


@dataclass(frozen=True)
class MoonParams:
    """MOON's model-contrastive term (Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021, Eq. 3-4)."""

    moon_mu: float = hp(
        1.0,
        "mu: weight of the model-contrastive loss (the paper: 5 on CIFAR-10, 1 on CIFAR-100 and Tiny-ImageNet)",
        low=0.0,
    )
    moon_tau: float = hp(0.5, "tau: temperature of the contrastive loss (the paper: 0.5)", low=0.0, low_open=True)


@dataclass(frozen=True)
class FedBABUParams:
    """FedBABU's fine-tuning at evaluation (Oh, Kim, Yun, "FedBABU: Towards Enhanced Representation for Federated
    Image Classification", ICLR 2022)."""

    fedbabu_finetune_epochs: int = hp(
        5, "epochs each client fine-tunes the received model for before it evaluates (PFLlib: 10)", low=0, high=1000
    )
    fedbabu_finetune_part: str = hp(
        "all",
        "what fine-tuning trains: `all` (body and head, the paper's and PFLlib's) or the `head` alone",
        choices=("all", "head"),
    )


@dataclass(frozen=True)
class PerFedAvgParams:
    """Per-FedAvg's inner step and variant (Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with
    Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020, Algorithm 1)."""

    perfedavg_alpha: float = hp(
        0.01,
        "alpha: the personal step's size (inner step in training, the one step before evaluation); the outer step "
        "beta is the run's lr (PFLlib sets both to its learning rate)",
        low=0.0,
        low_open=True,
    )
    perfedavg_variant: str = hp(
        "fo",
        "`fo`: first-order (the meta-gradient taken at the adapted weights); `hf`: Hessian-free, the correction "
        "-alpha H v on a third batch, its Hessian-vector product exact by automatic differentiation",
        choices=("fo", "hf"),
    )


@dataclass(frozen=True)
class PFedMeParams:
    """pFedMe's Moreau envelope, inner solver and server step (Dinh, Tran, Nguyen, "Personalized Federated Learning
    with Moreau Envelopes", NeurIPS 2020, Algorithm 1; defaults from the authors' code)."""

    pfedme_lambda: float = hp(
        15.0, "lambda: the pull between the personal model theta and the local model w_i", low=0.0, low_open=True
    )
    pfedme_k: int = hp(5, "K: inner steps that solve for theta on each mini-batch", low=1, high=100)
    pfedme_personal_lr: float = hp(
        0.09,
        "the inner steps' learning rate (the outer step eta that moves w_i is the run's lr; with SGD, "
        "lr x lambda < 2 or w_i diverges: refused)",
        low=0.0,
        low_open=True,
    )
    pfedme_beta: float = hp(
        1.0,
        "beta: the server's step w <- (1 - beta) w + beta (average of the w_i); 1 is FedAvg's average",
        low=0.0,
        high=2.0,
        low_open=True,
    )


@dataclass(frozen=True)
class FedALAParams:
    """FedALA's adaptive local aggregation (Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized
    Federated Learning", AAAI 2023; defaults from the authors' code)."""

    fedala_eta: float = hp(1.0, "eta: learning rate of the element-wise aggregation weights", low=0.0, low_open=True)
    fedala_rand_percent: int = hp(
        80,
        "s: percent of the client's training data (a seeded contiguous slice) that learns the weights",
        low=1,
        high=100,
    )
    fedala_layer_idx: int = hp(
        2,
        "p: the last p parameter tensors are aggregated element-wise, the lower ones taken from the global model "
        "(0: all of them; the default 2 is the classifier's weight and bias)",
        low=0,
        high=1000,
    )
    fedala_threshold: float = hp(
        0.1, "the start phase learns the weights until the last 10 epochs' losses have a std below this", low=0.0
    )
    fedala_max_start_epochs: int = hp(
        100, "at most this many epochs in the start phase (the authors' code has no bound)", low=1, high=10_000
    )


@dataclass(frozen=True)
class FedDBEParams:
    """FedDBE's mean regularization (Zhang et al., "Eliminating Domain Bias for Federated Learning in Representation
    Space", NeurIPS 2023; defaults from the authors' run script)."""

    feddbe_kappa: float = hp(
        50.0, "kappa: weight of the mean regularization toward the global mean representation (0: off)", low=0.0
    )
    feddbe_momentum: float = hp(
        1.0,
        "momentum of the running mean of representations over a local training's mini-batches (1: the current "
        "mini-batch's mean alone)",
        low=0.0,
        high=1.0,
        low_open=True,
    )


@dataclass(frozen=True)
class GPFLParams:
    """GPFL's regularizers (Zhang et al., "GPFL: Simultaneously Learning Global and Personalized Feature Information
    for Personalized Federated Learning", ICCV 2023; defaults: the authors' run script for 4-layer CNNs)."""

    gpfl_lambda: float = hp(
        0.01,
        "lambda: weight of the L2 distance between the global path's features and the received embeddings of their "
        "labels (the authors: 0.01 for CNNs and MLPs, 0.0001 for ResNet-18)",
        low=0.0,
    )
    gpfl_mu: float = hp(
        0.1, "mu: weight decay of the GCE's and CoV's parameters (the authors: 0.1 for CNNs, 0 for ResNet-18)", low=0.0
    )


@dataclass(frozen=True)
class FedCPParams:
    """FedCP's feature separation (Zhang et al., "FedCP: Separating Feature Information for Personalized Federated
    Learning via Conditional Policy", KDD 2023; defaults: the authors' run script)."""

    fedcp_lambda: float = hp(
        5.0,
        "lambda: weight of the maximum mean discrepancy between the trained and the received feature extractor's "
        "features (the authors' script: 5; PFLlib's default: 1)",
        low=0.0,
    )
    fedcp_tau: float = hp(
        1.0,
        "temperature of the policy's Gumbel-softmax split of each feature (the authors' code: 1)",
        low=0.0,
        low_open=True,
        high=100.0,
    )


@dataclass(frozen=True)
class AlgorithmSpec:
    """An algorithm: name, one-line summary, its two halves, hyperparameters, extra evaluation rows, and which
    part of the model travels (`shares`: all, head, body, or no-norm = all but normalization layers)."""

    name: str
    summary: str
    server: str  # "module:Class" in server_app.strategies
    client: str  # "module:Class" in client_app.algorithms
    params: type = NoParams
    eval_rows: tuple[EvalRow, ...] = ()
    shares: str = "all"
    averages_models: bool = False  # the server averages uploaded weights: `robust-aggregation` and attacks apply
    averages_updates: bool = False  # a weighted average of uploads all the same (sparse, pruned): max-update-ratio
    mixes_models: bool = False  # each client gets its own mix of the uploads, no sample counts (FedAMP's u_i)
    dp_refusal: str = ""  # why run-config `dp` (central or local) cannot apply, if it cannot
    # the server's average counts each client once (SCAFFOLD's 1/|S|), not by sample count: under `secagg` each
    # client's weight coordinate is then the full max-weight, and the round's sample count is unknown
    equal_weights: bool = False

    @property
    def bounds_updates(self) -> bool:
        """Whether run-config `max-update-ratio` applies: the server averages or mixes uploads."""
        return self.averages_models or self.averages_updates or self.mixes_models

    @property
    def protected_by(self) -> tuple[str, ...]:
        """The run-config keys, any one of which on lets a deployment of this algorithm start (allow-unprotected
        otherwise): the rule that stops one device's key from steering what the others receive. None where the
        server mixes no upload into another client's model by a rule of its own (Local; FedFomo's clients weigh
        each peer's model by their own validation gain)."""
        if self.averages_models:
            return ("robust-aggregation", "max-weight-ratio")
        if self.averages_updates:
            return ("max-weight-ratio",)
        return ("max-update-ratio",) if self.mixes_models else ()


SPECS: dict[str, AlgorithmSpec] = {
    spec.name: spec
    for spec in (
        AlgorithmSpec(
            "fedavg",
            "FedAvg: sample-weighted average of the clients' models",
            "fedavg:FedAvgStrategy",
            "fedavg:FedAvgClient",
            averages_models=True,
        ),
        AlgorithmSpec(
            "fedprox",
            "FedProx: FedAvg with a proximal term toward the global model",
            "fedavg:FedProxStrategy",
            "fedavg:FedProxClient",
            FedProxParams,
            averages_models=True,
        ),
        AlgorithmSpec(
            "fedavg-ft",
            "FedAvg+FT: FedAvg, then `local-epochs` of fine-tuning before each evaluation",
            "fedavg:FedAvgStrategy",
            "fedavg:FedAvgFTClient",
            averages_models=True,
        ),
        AlgorithmSpec(
            "local", "Local: every client trains alone; no weights travel", "local:LocalStrategy", "local:LocalClient"
        ),
        AlgorithmSpec(
            "feddst",
            "FedDST: sparse global model with periodic prune/regrow",
            "feddst:FedDSTStrategy",
            "feddst:FedDSTClient",
            FedDSTParams,
            averages_updates=True,
        ),
        AlgorithmSpec(
            "dmpfl",
            "DM-PFL (and DM-PFL+ in the same run): dual global/personal masks",
            "dmpfl:DMPFLStrategy",
            "dmpfl:DMPFLClient",
            DMPFLParams,
            (PLUS, GLOBAL, *SELECTOR_ROWS),
            averages_updates=True,
        ),
        AlgorithmSpec(
            "fedamp",
            "FedAMP: attentive personalized cloud models held by the server",
            "fedamp:FedAMPStrategy",
            "fedamp:FedAMPClient",
            FedAMPParams,
            (CLOUD,),
            mixes_models=True,
        ),
        AlgorithmSpec(
            "heurfedamp",
            "HeurFedAMP: FedAMP with cosine-similarity attention",
            "fedamp:HeurFedAMPStrategy",
            "fedamp:FedAMPClient",
            HeurFedAMPParams,
            (CLOUD,),
            mixes_models=True,
        ),
        AlgorithmSpec(
            "fliu",
            "FLIU: individualized updates with adaptive gamma",
            "fliu:FLIUStrategy",
            "fliu:FLIUClient",
            FLIUParams,
            averages_models=True,
        ),
        AlgorithmSpec(
            "fedfomo",
            "FedFomo: each client combines peers' models weighted by validation gain",
            "fedfomo:FedFomoStrategy",
            "fedfomo:FedFomoClient",
            FedFomoParams,
        ),
        AlgorithmSpec(
            "lg-fedavg",
            "LG-FedAvg: local body, global head; only the head travels",
            "partial:PartialStrategy",
            "partial:PartialClient",
            shares="head",
            averages_models=True,
        ),
        AlgorithmSpec(
            "fedper",
            "FedPer: global body, local head, trained together; only the body travels",
            "partial:PartialStrategy",
            "partial:PartialClient",
            shares="body",
            averages_models=True,
        ),
        AlgorithmSpec(
            "fedrep",
            "FedRep: global body, local head; head epochs, then body epochs; only the body travels",
            "partial:PartialStrategy",
            "partial:FedRepClient",
            shares="body",
            averages_models=True,
        ),
        AlgorithmSpec(
            "fedbn",
            "FedBN: FedAvg except batch-norm layers, which stay local (needs a `-bn` model)",
            "partial:PartialStrategy",
            "partial:PartialClient",
            shares="no-norm",
            averages_models=True,
        ),
        AlgorithmSpec(
            "dapperfl",
            "DapperFL: each device trains and sends an l1-pruned fusion of the global model",
            "dapperfl:DapperFLStrategy",
            "dapperfl:DapperFLClient",
            DapperFLParams,
            (GLOBAL,),
            averages_updates=True,
        ),
        AlgorithmSpec(
            "ditto",
            "Ditto: FedAvg's global model plus a personal model pulled toward it",
            "fedavg:FedAvgStrategy",
            "ditto:DittoClient",
            DittoParams,
            (GLOBAL,),
            averages_models=True,
        ),
        AlgorithmSpec(
            "apfl",
            "APFL: personalized mixture alpha v + (1 - alpha) w with a learned alpha",
            "fedavg:FedAvgStrategy",
            "apfl:APFLClient",
            APFLParams,
            (GLOBAL,),
            averages_models=True,
        ),
        AlgorithmSpec(
            "scaffold",
            "SCAFFOLD: FedAvg with control variates that correct each client's drift",
            "scaffold:ScaffoldStrategy",
            "scaffold:ScaffoldClient",
            ScaffoldParams,
            averages_models=True,
            equal_weights=True,
            dp_refusal="a client's change of its control variate travels beside its model and no DP mechanism here "
            "clips or noises it",
        ),
        AlgorithmSpec(
            "moon",
            "MOON: FedAvg with a contrastive pull of local features toward the global model's, away from the last "
            "local model's",
            "fedavg:FedAvgStrategy",
            "moon:MoonClient",
            MoonParams,
            averages_models=True,
        ),
        AlgorithmSpec(
            "fedbabu",
            "FedBABU: only the body trains and travels, the head stays at its random start; fine-tuned to evaluate",
            "partial:PartialStrategy",
            "fedbabu:FedBABUClient",
            FedBABUParams,
            (GLOBAL,),
            shares="body",
            averages_models=True,
        ),
        AlgorithmSpec(
            "perfedavg",
            "Per-FedAvg: FedAvg of a meta-learned model; each client adapts it by one step before it evaluates",
            "fedavg:FedAvgStrategy",
            "perfedavg:PerFedAvgClient",
            PerFedAvgParams,
            (GLOBAL,),
            averages_models=True,
        ),
        AlgorithmSpec(
            "pfedme",
            "pFedMe: each client's personal model solves a Moreau envelope around its local model; the local models "
            "are averaged, the global model moved by beta",
            "pfedme:PFedMeStrategy",
            "pfedme:PFedMeClient",
            PFedMeParams,
            (GLOBAL,),
            averages_models=True,
        ),
        AlgorithmSpec(
            "fedrod",
            "FedRoD: a generic model trained with the balanced softmax and averaged, a personalized head added to "
            "its logits on each client",
            "fedavg:FedAvgStrategy",
            "fedrod:FedRoDClient",
            eval_rows=(GLOBAL,),
            averages_models=True,
        ),
        AlgorithmSpec(
            "fedala",
            "FedALA: each client starts its training from an element-wise learned mix of its last local model and "
            "the global model",
            "fedavg:FedAvgStrategy",
            "fedala:FedALAClient",
            FedALAParams,
            (GLOBAL,),
            averages_models=True,
        ),
        AlgorithmSpec(
            "feddbe",
            "FedDBE: FedAvg with a personal bias vector on the features and a pull of the features' mean toward the "
            "clients' global mean",
            "feddbe:FedDBEStrategy",
            "feddbe:FedDBEClient",
            FedDBEParams,
            (GLOBAL,),
            averages_models=True,
            dp_refusal="each client's mean representation travels in round 0 and no DP mechanism here clips or "
            "noises it",
        ),
        AlgorithmSpec(
            "gpfl",
            "GPFL: a global category embedding and a conditional valve beside the model travel with the body; the "
            "head stays on each client, fed the features valved by its personalized conditional input",
            "gpfl:GPFLStrategy",
            "gpfl:GPFLClient",
            GPFLParams,
            shares="no-head",
            averages_models=True,
        ),
        AlgorithmSpec(
            "fedcp",
            "FedCP: a conditional policy splits each sample's features between the global head and the client's own "
            "head; the body, the policy and the global head travel",
            "fedcp:FedCPStrategy",
            "fedcp:FedCPClient",
            FedCPParams,
            averages_models=True,
        ),
    )
}


def eval_rows() -> tuple[EvalRow, ...]:
    """Every extra evaluation row any algorithm reports, once each, in registry order."""
    rows: dict[str, EvalRow] = {}
    for spec in SPECS.values():
        for row in spec.eval_rows:
            rows.setdefault(row.prefix, row)
    return tuple(rows.values())


def param_classes() -> list[type]:
    """The distinct hyperparameter dataclasses of the registered algorithms, in registry order."""
    return list(dict.fromkeys(spec.params for spec in SPECS.values()))


def resolve_half(package: str, ref: str, base: type) -> type:
    """The class a spec names as "module:Class" inside `package` (imported on first use), checked to be a `base`."""
    module, _, name = ref.partition(":")
    cls = getattr(import_module(f"{package}.{module}"), name, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{package}.{module}:{name} is not a {base.__name__}")
    return cls
