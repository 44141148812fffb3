"""An algorithm's server half: the hooks the round runner (server_app/runner.py) calls. Default: FedAvg."""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.supercore import log

from common.algorithms import SPECS
from common.config import RunConfig
from common.hparams import ConfigError
from common.learning.evaluate import shift_key
from common.learning.models import ModelLayout
from common.methods.distributed_dp import (
    PrivacyLedger,
    RoundPlan,
    mean_update,
    noise_multiplier_for,
    plan_round,
    round_rho,
)
from common.methods.privacy import (
    ACCOUNTANT_HINT,
    AdaptiveClip,
    CentralDp,
    Support,
    accountant_installed,
    epsilon,
    local_dp_epsilon,
    poisson_sample,
)
from common.methods.robust import (
    peer_scales,
    robust_average,
    robust_clip,
    scale_updates,
    update_norms,
    walk_direction,
    walk_seed,
)
from common.secagg.encoding import Decoded
from common.wire.messages import ARRAYS, CONFIG, FINETUNE_EPOCHS, LR_STEP, NEWCOMER_MODEL, PARTITION_ID, SERVER_ROUND
from common.wire.records import to_record
from common.wire.validation import read_fraction, validate_arrays

from ..clients import ClientRegistry, RunAborted, sample_size, seeded_sample
from ..replies import TrainReply


class PFLStrategy:
    """Server half of an algorithm. The runner owns the loop, the clients' messages and the reply checks; these
    hooks decide what each client is sent, how replies are decoded and aggregated, and what state is kept.

    Every hook gets the round it serves. Round 0 is a warm-up round before round 1 (e.g. FedAMP's local
    pre-training) run only when `warmup_round()` says so.
    """

    uploads_weights: ClassVar[bool] = True  # training replies carry the whole model as float32 arrays
    sends_weights_for_eval: ClassVar[bool] = True  # evaluation messages carry the global model

    def __init__(self, cfg: RunConfig, model: ModelLayout, clients: ClientRegistry) -> None:
        self.cfg = cfg
        self.specs = model.specs
        self.prunable = list(model.prunable)
        self.global_arrays = list(model.initial)
        self.clients = clients
        self.aggregation_fields: dict[str, Any] = {}  # {"robust": what the rule did} after a robust aggregation
        self.peer_bound: dict[str, Any] = {}  # what run-config max-update-ratio did this round (reset by the runner)
        self.workdir: Path | None = None  # the run folder, where large server state may live on disk (set by the app)
        self._payload: tuple[tuple[int, str], dict[str, Any]] | None = None  # round_payload's last one
        self.train_calls: dict[int, int] = {}  # training messages each client was sent (lr-decay-step client)
        if cfg.dp != "none" and not accountant_installed():
            raise ConfigError(f"run-config 'dp' needs the privacy accountant: {ACCOUNTANT_HINT}")
        self.dp: CentralDp | None = None  # run-config `dp` = central, made at its first round (it needs the clients)
        self.dp_rounds = 0  # rounds aggregated under DP: what the accountant composes
        self.dp_uploads: dict[int, int] = {}  # local DP: the noised uploads of each client so far
        self.dp_clip = cfg.dp_clip_norm  # central DP's clip bound of the next round (it moves under dp-adaptive-clip)
        self.dp_band_logged = False  # whether the log said the adaptive bound reached dp-clip-band's edge
        self.dp_distributed_z: float | None = None  # run-config `dp` = distributed: the noise multiplier, once solved
        self.dp_ledger = PrivacyLedger(cfg.dp_delta)  # distributed DP: each client's zCDP rho so far
        # the DP noise's seed: secret unless a study fixes it (dp-noise-seed); kept in the checkpoint for a resume
        self.dp_noise_seed = cfg.dp_noise_seed or secrets.randbits(63)

    def prepare(self) -> None:
        """Before the first round, once the handshake has counted the clients: central DP's noise is solved (or
        checked) now, so a budget the run's clients cannot meet stops the run before any training (RunAborted)."""
        if self.cfg.dp == "central" and self.dp is None:
            try:
                self.central_dp()
            except ValueError as exc:
                raise RunAborted(f"central DP: {exc}") from None

    # ----- who takes part ----------------------------------------------------------------------------
    def sample(self, server_round: int) -> list[int]:
        """Seeded choice of this round's training clients (partition ids), independent of node ids; under central DP
        a secret Poisson sample (`private_sample`)."""
        cfg = self.cfg
        if cfg.dp == "central":
            return self.private_sample(server_round)
        return seeded_sample(
            self.clients.ids(), cfg.fraction_train, cfg.min_train_clients, cfg.seed, "sample", server_round
        )

    def private_sample(self, server_round: int) -> list[int]:
        """Central DP's sample: each client independently with probability q = planned clients / clients, drawn from
        the secret noise seed. The accountant composes Poisson-subsampled Gaussian mechanisms, so the runner samples
        that way (a fixed-size sample is another mechanism), and from a secret: a sample drawn from the run seed,
        which config.json shows, tells anyone which rounds a client took part in and voids the amplification by
        sampling that the epsilon counts on. The round's size varies around the planned number, and may be 0."""
        return poisson_sample(self.clients.ids(), self.central_dp().sample_rate, self.dp_noise_seed, server_round)

    def releases_without_uploads(self, server_round: int) -> bool:
        """Whether a round that accepted no upload still aggregates: under central DP every round that uploads
        releases its noised mean, noise alone when the sample was empty or every sampled client failed, so that each
        round is the mechanism the accountant composes whoever took part."""
        return self.cfg.dp == "central" and self.uploads_in_round(server_round)

    def eval_clients(self, server_round: int) -> list[int]:
        """Clients evaluated this round (all by default; a seeded fraction otherwise)."""
        return seeded_sample(
            self.clients.ids(), self.cfg.fraction_evaluate, 1, self.cfg.seed, "eval-sample", server_round
        )

    def warmup_round(self) -> bool:
        """Whether every client gets a training message of round 0 before round 1 (none by default)."""
        return False

    # ----- messages --------------------------------------------------------------------------------------
    def round_config(self, server_round: int, partition_id: int) -> ConfigRecord:
        """Instructions sent with every message of a round (the runner adds its own keys); under `lr-decay-step`
        client, the client's count of earlier local training calls (its lr step)."""
        config = ConfigRecord({SERVER_ROUND: server_round, PARTITION_ID: partition_id})
        if self.cfg.lr_decay_step == "client":
            config[LR_STEP] = self.train_calls.get(partition_id, 0)
        return config

    def global_record(self) -> ArrayRecord:
        """The current global model as one ArrayRecord (named like the model's state dict)."""
        return to_record([name for name, _ in self.specs], self.global_arrays)

    def shared_payload(self, server_round: int) -> dict[str, Any]:
        """Objects built once per round and shared by every client's message (never mutated)."""
        return {"global": self.global_record()}

    def round_payload(self, server_round: int, kind: str) -> dict[str, Any]:
        """`shared_payload`, built once per round and kind of message, not once per batch of the evaluation's window:
        the same objects in every message (one serialization of the global model; on the in-process engine, one
        shared-memory block)."""
        if self._payload is None or self._payload[0] != (server_round, kind):
            self._payload = ((server_round, kind), self.shared_payload(server_round))
        return self._payload[1]

    def train_message(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """`train_content`, then the client's count of training calls moves on (what the runner calls)."""
        content = self.train_content(server_round, partition_id, shared)
        self.train_calls[partition_id] = self.train_calls.get(partition_id, 0) + 1
        return content

    def train_content(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """Content of one client's training message (default: the global model)."""
        return RecordDict({ARRAYS: shared["global"], CONFIG: self.round_config(server_round, partition_id)})

    def eval_content(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """Content of one client's evaluation message (default: the global model)."""
        content = RecordDict({CONFIG: self.round_config(server_round, partition_id)})
        if self.sends_weights_for_eval:
            content[ARRAYS] = shared["global"]
        return content

    def newcomer_record(self) -> ArrayRecord:
        """What a client that never trained receives (held-out clients): the global model by default."""
        return self.global_record()

    def newcomer_content(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """A held-out client's evaluation message: the newcomer model, once per round, and its fine-tuning epochs."""
        if NEWCOMER_MODEL not in shared:
            shared[NEWCOMER_MODEL] = self.newcomer_record()
        config = self.round_config(server_round, partition_id)
        config[NEWCOMER_MODEL] = True
        config[FINETUNE_EPOCHS] = self.cfg.holdout_finetune_epochs
        return RecordDict({ARRAYS: shared[NEWCOMER_MODEL], CONFIG: config})

    # ----- replies ---------------------------------------------------------------------------------------
    def decode_train_reply(self, server_round: int, reply: TrainReply) -> None:
        """Decode and validate a reply's upload into `reply` (PayloadError if it must not be used)."""
        if self.uploads_weights:
            reply.arrays = validate_arrays(reply.content.array_records.get(ARRAYS), self.specs)

    def secure_specs(self) -> list[tuple[str, tuple[int, ...]]]:
        """The arrays a training reply uploads, in order: what a masked vector carries under run-config `secagg`
        (server_app/secure.py; common/config.py refuses `secagg` for the algorithms whose upload is not this)."""
        return list(self.specs)

    def secure_layout(self, server_round: int) -> tuple[list[tuple[str, int]], list[str]]:
        """Under `secagg`: the (name, size) of each array the round's masked vector carries, and which of them the
        clients upload on their own masks (with per-position weights and votes)."""
        return [(name, math.prod(shape)) for name, shape in self.secure_specs()], []

    def aggregate_secure(self, server_round: int, decoded: Decoded, survivors: int, loss: float) -> None:
        """Under `secagg`: fold the cohort's sum in. Default: the weighted mean of each array goes to `aggregate` as
        one reply holding the cohort's total weight (the weighted average of that one reply is the mean itself),
        so the algorithm's own aggregate runs unchanged."""
        means = [decoded.mean(name).reshape(shape).astype(np.float32) for name, shape in self.secure_specs()]
        samples = max(1, round(decoded.samples(self.cfg.secagg_max_weight)))
        self.aggregate(server_round, [TrainReply(-1, samples, loss, RecordDict(), arrays=means)])

    def distributed_plan(self, dimension: int, cohort: int) -> RoundPlan:
        """Distributed DP's integers for a round of `cohort` clients uploading `dimension` values (ValueError when
        the modulus cannot hold them); the noise multiplier solved once, as each client solves it."""
        cfg = self.cfg
        if self.dp_distributed_z is None:
            self.dp_distributed_z = noise_multiplier_for(
                cfg.dp_noise_multiplier, cfg.dp_target_epsilon, cfg.num_rounds, cfg.dp_delta
            )
            log(
                INFO,
                "distributed DP: each client clips its update to %g and adds discrete Gaussian noise so that the "
                "cohort's sum carries noise multiplier %.4f%s%s; epsilon at delta %g of a client in all %d rounds, "
                "every client of each cohort answering: %.3f (no amplification by sampling: the server knows who "
                "takes part)",
                cfg.dp_clip_norm,
                self.dp_distributed_z,
                f" (solved for epsilon {cfg.dp_target_epsilon:g})" if cfg.dp_target_epsilon > 0 else "",
                f" without the noise of any {cfg.dp_colluding_clients} of them" if cfg.dp_colluding_clients else "",
                cfg.dp_delta,
                cfg.num_rounds,
                epsilon(self.dp_distributed_z, 1.0, cfg.num_rounds, cfg.dp_delta),
            )
        return plan_round(
            cfg.dp_clip_norm,
            self.dp_distributed_z,
            dimension,
            cohort,
            cfg.secagg_modulus_range,
            cfg.dp_colluding_clients,
        )

    def secure_reference(self) -> list[np.ndarray]:
        """The arrays the clients started from, in `secure_specs` order (their update's reference)."""
        by_name = {name: array for (name, _), array in zip(self.specs, self.global_arrays, strict=True)}
        return [by_name[name] for name, _ in self.secure_specs()]

    def aggregate_distributed(self, server_round: int, total: np.ndarray, plan: RoundPlan, clients: list[int]) -> None:
        """Distributed DP's round: reference + the mean update of the exact integer sum goes to `aggregate` as one
        reply, so the algorithm's own aggregate runs unchanged; each client in the sum is charged the round's rho
        (fewer than the cohort answering: less noise, a larger rho, and a WARNING line)."""
        answered = len(clients)
        flat = mean_update(total, plan, answered)
        models, start = [], 0
        for (_, shape), reference in zip(self.secure_specs(), self.secure_reference(), strict=True):
            size = math.prod(shape)
            update = flat[start : start + size].reshape(shape)
            models.append((np.asarray(reference, np.float64) + update).astype(np.float32))
            start += size
        self.aggregate(server_round, [TrainReply(-1, 1, float("nan"), RecordDict(), arrays=models)])
        rho = round_rho(plan, answered)
        self.dp_ledger.record(clients, rho)
        z = self.dp_distributed_z or 0.0
        honest = answered - plan.colluding  # the contributions whose noise is counted on
        effective = z * math.sqrt(max(0, honest) / (plan.cohort - plan.colluding))
        if honest < 1:
            log(
                ERROR,
                "distributed DP, round %d: %d clients are in the sum and dp-colluding-clients is %d: no noise in it "
                "can be counted on, so the run's epsilon is infinite from this round on",
                server_round,
                answered,
                plan.colluding,
            )
        elif answered < plan.cohort:
            log(
                WARNING,
                "distributed DP, round %d: %d of the cohort's %d clients are in the sum, so it carries noise "
                "multiplier %.4f, below the planned %.4f; the epsilon counts it",
                server_round,
                answered,
                plan.cohort,
                effective,
                z,
            )
        self.aggregation_fields["dp"] = {
            "mode": "distributed",
            "adjacency": "zero-out (a client's update against 0: sensitivity C), no amplification by sampling",
            "epsilon": self.dp_ledger.epsilon(),
            "delta": self.cfg.dp_delta,
            "noise_multiplier": z,
            "effective_noise_multiplier": effective,
            "rho": rho,
            "clip_bound": self.cfg.dp_clip_norm,
            "clipped": 0,
            "cohort": plan.cohort,
            "answered": answered,
            "colluding": plan.colluding,
        }

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """Fold validated replies into the server state (default: sample-weighted average, FedAvg)."""
        self.global_arrays = self.average(replies, [r.weight for r in replies], self.global_arrays)

    def uploads_in_round(self, server_round: int) -> bool:
        """Whether this round's training replies carry weights (all rounds by default; DM-PFL's phase 3 none)."""
        return True

    def average(
        self, replies: list[TrainReply], weights: Sequence[float], reference: list[np.ndarray]
    ) -> list[np.ndarray]:
        """The uploaded models' weighted average, or the run's `robust-aggregation` rule around `reference`
        (the model the clients started from)."""
        if self.cfg.dp == "central":
            return self.dp_average([uploaded(r) for r in replies], reference)
        models = self.bound_to_peers([uploaded(r) for r in replies], reference)
        private = {"dp": self.count_local_dp(replies)} if self.cfg.dp == "local" else {}
        averaged, report = robust_average(models, weights, reference, self.cfg.robust_rule)
        self.aggregation_fields = {**({"robust": report} if report else {}), **private}
        if "skipped" in report:
            log(WARNING, "robust aggregation %s: %s; the model is kept", report["method"], report["skipped"])
        return averaged

    def bound_to_peers(
        self, models: Sequence[Sequence[np.ndarray]], reference: Sequence[np.ndarray]
    ) -> Sequence[Sequence[np.ndarray]]:
        """Run-config `max-update-ratio`: each update (model - reference) at most that many times the median norm
        of the round's other updates (common/methods/robust.peer_scales), recorded in `peer_bound`; the models as
        they are when it is 0."""
        if self.cfg.max_update_ratio <= 0 or not models:
            return models
        scales = self.peer_factors(update_norms(models, reference))
        return scale_updates(models, reference, scales.tolist())

    def peer_factors(self, norms: np.ndarray) -> np.ndarray:
        """Each update's factor under run-config `max-update-ratio` (> 0) given the round's update norms, and the
        round's `peer_bound` record (the ratio, how many were shortened, the longest norm)."""
        ratio = self.cfg.max_update_ratio
        scales = peer_scales(norms, ratio)
        self.peer_bound = {"ratio": ratio, "clipped": int(np.sum(scales < 1.0)), "max_norm": float(np.max(norms))}
        return scales

    def dp_average(self, models: Sequence[Sequence[np.ndarray]], reference: list[np.ndarray]) -> list[np.ndarray]:
        """Central DP's aggregate (run-config `dp`): the uploads as `dp_contributions` gives them, each clipped to
        `dp-clip-norm`, averaged over the planned clients, noised; sample counts do not weigh in (one client's
        influence is what DP bounds)."""
        models, robust = self.dp_contributions(models, reference)
        averaged = self.private_mean(models, reference)
        if robust:
            self.aggregation_fields["robust"] = robust
        return averaged

    def dp_contributions(
        self, models: Sequence[Sequence[np.ndarray]], reference: Sequence[np.ndarray]
    ) -> tuple[Sequence[Sequence[np.ndarray]], dict[str, Any]]:
        """The uploads as central DP clips and sums them: after every rule that runs before DP's clip. Each such rule
        must map one client's upload from that upload alone, or one client's presence could move the others'
        contributions past DP's sensitivity: common/config.py refuses the relative ones under `dp` = central (the
        peer bound, `clip` at the round's median norm, the coordinate-wise rules), so what is left is `clip` at a
        fixed robust-clip-norm; and what the rule did."""
        models = self.bound_to_peers(models, reference)  # a no-op under central DP (max-update-ratio refused)
        if self.cfg.robust_aggregation == "clip" and models:
            clipped, robust = robust_clip(models, reference, self.cfg.robust_rule)
            return clipped, robust
        return models, {}

    def private_mean(
        self,
        models: Sequence[Sequence[np.ndarray]],
        reference: list[np.ndarray],
        supports: Sequence[Support] | None = None,
        shared: Support | None = None,
    ) -> list[np.ndarray]:
        """One round of central DP (CentralDp.aggregate: each model's update clipped on its support, noise on the
        shared coordinates), counted for the accountant and reported in the round's record."""
        averaged, report = self.central_dp().aggregate(
            models, reference, self.dp_rounds, self.dp_clip, supports, shared
        )
        self.dp_rounds += 1
        self.dp_clip = report.pop("next_clip_bound")
        if report.get("clip_band_reached") and not self.dp_band_logged:  # once a run: every round's record says it
            self.dp_band_logged = True
            log(
                WARNING,
                "central DP: the adaptive clip bound reached dp-clip-band's edge (%g, dp-clip-norm %g x or / %g); "
                "it stays there: widen dp-clip-band if dp-clip-norm was a rough guess, or a majority of the clients "
                "steers the count (docs/robustness.md)",
                self.dp_clip,
                self.cfg.dp_clip_norm,
                self.cfg.dp_clip_band,
            )
        self.aggregation_fields = {"dp": {"mode": "central", **report}}
        return averaged

    def count_local_dp(self, replies: list[TrainReply]) -> dict[str, Any]:
        """Local DP: the epsilon of the client that ran the mechanism most often so far, under replace-one adjacency.

        Every training message a client was sent counts as one noised upload, whether its reply came in time, came
        late, was rejected or never came: the client ran the mechanism when it trained, and any reply that reaches
        the server can be read, so the count is never below the uploads the server may hold. Between two data sets
        of one client its clipped update can move by 2C (replace-one: C in one direction, C in the other), so each
        upload is a Gaussian mechanism of multiplier z / 2 (std z * C over a sensitivity of 2C); the server knows
        who took part, so no amplification by sampling applies."""
        cfg = self.cfg
        for reply in replies:
            self.dp_uploads[reply.partition_id] = self.dp_uploads.get(reply.partition_id, 0) + 1
        most = max([*self.dp_uploads.values(), *self.train_calls.values()], default=0)
        return {
            "mode": "local",
            "adjacency": "replace-one (sensitivity 2C)",
            "epsilon": local_dp_epsilon(cfg.dp_noise_multiplier, most, cfg.dp_delta),
            "delta": cfg.dp_delta,
            "noise_multiplier": cfg.dp_noise_multiplier,
            "clip_bound": cfg.dp_clip_norm,
            "uploads_max": most,
            "metrics": "withheld" if cfg.privacy.withholds_metrics else "reported without noise, outside epsilon",
        }

    def central_dp(self) -> CentralDp:
        """The run's central DP, made (and logged) the first time a round needs it: the sampling rate needs the
        clients of the handshake, and a noise multiplier solved for a target epsilon needs the sampling rate."""
        if self.dp is None:
            cfg, ids = self.cfg, self.clients.ids()
            expected = sample_size(len(ids), cfg.fraction_train, cfg.min_train_clients)
            # what the accountant composes: the rounds whose uploads are aggregated (not DM-PFL's phase 3)
            planned = sum(self.uploads_in_round(r) for r in range(1, cfg.num_rounds + 1))
            # the count's noise: count_noise_for(m, z) once z is known (solved for a target epsilon or given)
            adaptive = (
                AdaptiveClip(
                    cfg.dp_clip_quantile,
                    cfg.dp_clip_learning_rate,
                    0.0,
                    cfg.dp_clip_norm / cfg.dp_clip_band,
                    cfg.dp_clip_norm * cfg.dp_clip_band,
                )
                if cfg.dp_adaptive_clip
                else None
            )
            self.dp = CentralDp(
                cfg.dp_noise_multiplier,
                cfg.dp_target_epsilon,
                cfg.dp_delta,
                expected,
                len(ids),
                planned,
                self.dp_noise_seed,
                adaptive,
            )
            solved = f" (solved for epsilon {cfg.dp_target_epsilon:g})" if cfg.dp_target_epsilon > 0 else ""
            log(
                INFO,
                "central DP: updates clipped to %g%s, noise multiplier %.4f%s, each of %d clients a round with "
                "probability %.4g (Poisson, %d expected); epsilon at delta %g after the run's %d aggregated rounds: "
                "%.3f",
                self.dp_clip,
                f" (adaptive, toward the {cfg.dp_clip_quantile:g} quantile, kept within "
                f"[{cfg.dp_clip_norm / cfg.dp_clip_band:g}, {cfg.dp_clip_norm * cfg.dp_clip_band:g}])"
                if adaptive
                else "",
                self.dp.noise_multiplier,
                solved,
                len(ids),
                self.dp.sample_rate,
                expected,
                cfg.dp_delta,
                planned,
                self.dp.epsilon(planned),
            )
        return self.dp

    def eval_metrics(self, server_round: int, metrics: Mapping[str, Any] | None) -> dict[str, float]:
        """The extra accuracy rows of the algorithm's spec (a required row missing rejects the reply)."""
        out: dict[str, float] = {}
        for row in SPECS[self.cfg.algorithm].eval_rows:
            for degree in self.cfg.shift_degrees:
                key = row.prefix + shift_key(degree)
                if row.required or (metrics is not None and key in metrics):
                    out[key] = read_fraction(metrics, key)
        return out

    def on_client_reply(self, server_round: int, partition_id: int, ok: bool) -> None:
        """Called for every reply from a known client, failed or not (default: nothing)."""

    def on_client_replaced(self, server_round: int, partition_id: int) -> None:
        """A new node took over a partition (e.g. a restarted SuperNode); default: nothing to forget."""

    def round_record(self, server_round: int) -> dict[str, Any]:
        """Algorithm-specific fields of the round's line in metrics.jsonl; by default only `walk_record`'s."""
        return self.walk_record()

    def walk_record(self) -> dict[str, Any]:
        """Simulation under `attack-walk`: how far along the walkers' direction the global model lies (`walk`)."""
        if self.cfg.attack_walk <= 0:
            return {}
        flat = np.concatenate([np.ravel(a) for a in self.global_arrays]).astype(np.float64)
        return {"walk": {"global": float(flat @ walk_direction(flat.size, walk_seed(self.cfg.seed)))}}

    def artifacts(self) -> dict[str, np.ndarray]:
        """Arrays the report draws at the end of the run (artifacts.npz; e.g. attention, mask overlap); none here."""
        return {}

    def close(self) -> None:
        """The run is over: release what the strategy keeps on disk or in memory beyond its checkpoint."""

    # ----- state ---------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to go on exactly as this one would (arrays and JSON values)."""
        state: dict[str, Any] = {"global": list(self.global_arrays)}
        if self.cfg.lr_decay_step == "client" or self.cfg.dp == "local":  # local DP counts the messages sent
            state["train-calls"] = {str(pid): n for pid, n in self.train_calls.items()}
        if self.cfg.dp != "none":
            state["dp-rounds"] = self.dp_rounds
            state["dp-noise-seed"] = self.dp_noise_seed
            state["dp-uploads"] = {str(pid): n for pid, n in self.dp_uploads.items()}
            state["dp-clip"] = self.dp_clip
            state["dp-rho"] = {str(pid): rho for pid, rho in self.dp_ledger.spent.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (shapes checked against the model)."""
        arrays = [np.asarray(a, dtype=np.float32) for a in state["global"]]
        if [a.shape for a in arrays] != [tuple(shape) for _, shape in self.specs]:
            raise ValueError("checkpoint's global model does not match the configured model")
        if not all(np.all(np.isfinite(a)) for a in arrays):
            raise ValueError("checkpoint's global model has NaN or Inf values")
        self.global_arrays = arrays
        calls = state.get("train-calls", {})
        if self.cfg.lr_decay_step == "client" and "train-calls" not in state:
            log(WARNING, "checkpoint holds no training-call counts: every client's lr step restarts at 0")
        self.train_calls = {int(pid): int(n) for pid, n in calls.items()}
        self.dp_rounds = int(state.get("dp-rounds", 0))
        self.dp_uploads = {int(pid): int(n) for pid, n in state.get("dp-uploads", {}).items()}
        self.dp_clip = float(state.get("dp-clip", self.cfg.dp_clip_norm))
        spent = {int(pid): float(rho) for pid, rho in state.get("dp-rho", {}).items()}
        self.dp_ledger = PrivacyLedger(self.cfg.dp_delta, spent)
        if self.cfg.dp_adaptive_clip:  # a checkpoint from before dp-clip-band, or of another band: within this one
            band = self.cfg.dp_clip_band
            self.dp_clip = min(max(self.dp_clip, self.cfg.dp_clip_norm / band), self.cfg.dp_clip_norm * band)
        if "dp-noise-seed" in state:
            self.dp_noise_seed = int(state["dp-noise-seed"])


def uploaded(reply: TrainReply) -> list[np.ndarray]:
    """The model arrays a reply uploaded (only called for strategies whose replies carry them)."""
    if reply.arrays is None:
        raise ValueError(f"client {reply.partition_id}'s reply carries no model")
    return reply.arrays
