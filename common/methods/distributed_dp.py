"""Distributed DP under secure aggregation (run-config `dp` = distributed): each client adds a share of the noise to
its own clipped update, in integers, and the server sees only the sum.

The mechanism is the distributed discrete Gaussian of Kairouz, Liu and Steinke, "The Distributed Discrete Gaussian
Mechanism for Federated Learning with Secure Aggregation", ICML 2021 (arXiv:2102.06387): a client scales its clipped
update to integer units, rounds it stochastically and adds discrete Gaussian noise; the masked sum is exact in
integers, so the server's view is the sum of the rounded updates plus the sum of the clients' noise. Noise added in
floats before quantization would not do: each client's rounding acts on its own noised vector, the sum is then no
function of the summed Gaussian noise, and only the client's own share would protect it.

Where we differ from the paper: no random rotation and no conditional rounding. The scale is chosen so the sum of
the cohort's worst-case rounded updates and 40 standard deviations of the summed noise fit the modulus (no modular
clipping to guard against), and the rounded update's L2 bound is the worst case scale * C + sqrt(d) (the paper's
bound with beta = 0), so no rounding is ever redrawn.

The privacy of one round is Proposition 14's third term (as in the authors' accounting code): the sum of n
discrete Gaussians of std sigma on a query of L2 sensitivity D is rho-zCDP with
rho = (D / (sqrt(n) sigma) + sqrt(d) tau)^2 / 2, tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1));
dp-accounting composes the rounds (ZCDpEvent) and converts to (epsilon, delta). The adjacency is zero-out (Kairouz
et al., "Practical and Private (Deep) Learning without Sampling or Shuffling", ICML 2021): a client's data against
none while its device still takes part, since the server runs the protocol with it and knows that it did; its
rounded update moves the sum by at most D and its own noise is there either way. For the same reason no
amplification by sampling is counted. The sampler is Algorithm 3
of Canonne, Kamath and Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020 (arXiv:2004.00010),
vectorized with NumPy (diffprivlib's sampler draws one value per call: a Python loop over a model's coordinates).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from common.methods.privacy import noise_for_epsilon
from common.secagg.encoding import stochastic_round

TAIL_STDS = 40.0  # the summed noise's deviation the modulus must hold on top of the rounded updates
LEAST_SCALED_CLIP = 10.0  # the scaled clip bound must be this many times sqrt(d): rounding inflates D by <= 10%
# Algorithms run-config `dp` = distributed refuses beyond those secure aggregation refuses, and why.
DISTRIBUTED_DP_REFUSED = {
    name: "its rounds on each client's own mask carry per-position counts and mask votes beside the update, which "
    "distributed DP does not noise (not built yet; central DP runs it on the global mask)"
    for name in ("dmpfl", "feddst")
}
DP_UPDATE = "dp/update"  # the masked vector's one section under distributed DP: the client's integer contribution


@dataclass(frozen=True)
class RoundPlan:
    """One round's integers: `scale` (integer units per unit of update), `sensitivity` (D, the bound on a client's
    rounded update's L2 norm in those units) and `local_std` (each client's noise std in those units, z D /
    sqrt(cohort), so that the cohort's summed noise has std z D)."""

    scale: float
    sensitivity: float
    local_std: float
    cohort: int
    dimension: int
    colluding: int = 0  # clients of a sum whose noise is not counted on (they may tell the server theirs)


def plan_round(
    clip: float, noise_multiplier: float, dimension: int, cohort: int, modulus: int, colluding: int = 0
) -> RoundPlan:
    """The round's scale for `cohort` clients, each clipping to `clip` and adding noise such that any `cohort -
    colluding` of them together add noise multiplier z (the others may tell the server their noise), so that their
    sum cannot wrap around `modulus` (decoded centred: |sum| < modulus / 2); ValueError when the modulus leaves too
    little room for the rounding to stay small beside the signal, or no client is left to count on."""
    if clip <= 0 or noise_multiplier <= 0 or dimension < 1 or cohort < 1 or colluding < 0:
        raise ValueError(f"clip {clip}, noise multiplier {noise_multiplier}, {dimension} values, {cohort} clients")
    if colluding >= cohort:
        raise ValueError(
            f"dp-colluding-clients {colluding} leaves no client of a round of {cohort} whose noise can be counted on"
        )
    trusted = cohort - colluding
    whole = noise_multiplier * math.sqrt(cohort / trusted)  # the whole cohort's noise, over D
    root = math.sqrt(dimension)
    half = modulus / 2 - 1
    # cohort * (scaled_clip + 1) + TAIL_STDS * whole * (scaled_clip + root) <= half: per coordinate, each rounded
    # update is at most scaled_clip + 1 and the summed noise's std is at most whole * D
    scaled_clip = (half - cohort - TAIL_STDS * whole * root) / (cohort + TAIL_STDS * whole)
    if scaled_clip < LEAST_SCALED_CLIP * root:
        raise ValueError(
            f"a modulus of 2**{int(math.log2(modulus))} leaves a scaled clip bound of {scaled_clip:.0f} for "
            f"{cohort} clients and {dimension} values (at least {LEAST_SCALED_CLIP:g} x sqrt(values) = "
            f"{LEAST_SCALED_CLIP * root:.0f} needed): raise secagg-modulus-range"
        )
    sensitivity = scaled_clip + root
    return RoundPlan(
        scale=scaled_clip / clip,
        sensitivity=sensitivity,
        local_std=noise_multiplier * sensitivity / math.sqrt(trusted),
        cohort=cohort,
        dimension=dimension,
        colluding=colluding,
    )


def discrete_gaussian(sigma: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` draws of the discrete Gaussian N_Z(0, sigma^2) (P[x] proportional to exp(-x^2 / (2 sigma^2)) on the
    integers), int64: Canonne, Kamath and Steinke's Algorithm 3, a discrete Laplace of scale t = floor(sigma) + 1
    kept with probability exp(-(|y| - sigma^2 / t)^2 / (2 sigma^2))."""
    if not sigma > 0:
        raise ValueError(f"sigma must be positive, got {sigma}")
    t = math.floor(sigma) + 1
    success = -math.expm1(-1.0 / t)  # a discrete Laplace is the difference of two geometric counts of failures
    out = np.empty(size, np.int64)
    pending = np.arange(size)
    while pending.size:
        y = rng.geometric(success, pending.size) - rng.geometric(success, pending.size)
        keep = rng.random(pending.size) < np.exp(-((np.abs(y) - sigma**2 / t) ** 2) / (2 * sigma**2))
        out[pending[keep]] = y[keep]
        pending = pending[~keep]
    return out


def client_contribution(update: np.ndarray, clip: float, plan: RoundPlan, rng: np.random.Generator) -> np.ndarray:
    """A client's integer share of the round's sum: its flat update clipped to L2 norm `clip`, scaled, rounded
    stochastically (each coordinate moves by less than 1, so the L2 norm stays within plan.sensitivity) plus its
    discrete Gaussian noise (`rng` must be secret from the server)."""
    values = np.asarray(update, np.float64).reshape(-1)
    if values.size != plan.dimension or not np.all(np.isfinite(values)):
        raise ValueError(f"an update of {values.size} finite values is needed, the round plans {plan.dimension}")
    norm = float(np.linalg.norm(values))
    scaled = values * (min(1.0, clip / norm) if norm > 0 else 1.0) * plan.scale
    return stochastic_round(scaled, rng) + discrete_gaussian(plan.local_std, values.size, rng)


def mean_update(total: np.ndarray, plan: RoundPlan, answered: int) -> np.ndarray:
    """The round's mean update from the exact integer sum of `answered` contributions (float64)."""
    if answered < 1:
        raise ValueError("no contribution in the sum")
    return np.asarray(total, np.float64) / (plan.scale * answered)


def round_rho(plan: RoundPlan, answered: int) -> float:
    """The zCDP rho of one round whose sum holds `answered` clients' contributions (Proposition 14's third term),
    counting the noise of all but `plan.colluding` of them; fewer than the cohort answering means less noise and a
    larger rho, none to count on an infinite one."""
    if answered < 1:
        raise ValueError("no contribution in the sum")
    honest = answered - plan.colluding
    if honest < 1:
        return math.inf
    k = np.arange(1, honest, dtype=np.float64)
    tau = 10.0 * float(np.sum(np.exp(-2 * math.pi**2 * plan.local_std**2 * k / (k + 1))))
    l2 = plan.sensitivity / (math.sqrt(honest) * plan.local_std)
    return (l2 + math.sqrt(plan.dimension) * tau) ** 2 / 2


def zcdp_epsilon(rho: float, delta: float) -> float:
    """Epsilon at `delta` of rho-zCDP, from dp-accounting's RDP accountant (0 for rho 0)."""
    if rho <= 0:
        return 0.0
    if math.isinf(rho):
        return math.inf
    import dp_accounting
    from dp_accounting import rdp

    from common.methods.privacy import RDP_ORDERS

    accountant = rdp.RdpAccountant(orders=list(RDP_ORDERS))
    accountant.compose(dp_accounting.ZCDpEvent(rho))
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=16)
def noise_multiplier_for(noise_multiplier: float, target_epsilon: float, rounds: int, delta: float) -> float:
    """The run's z: given, or solved so that a client in every one of `rounds` rounds, the whole cohort answering,
    spends `target_epsilon` (no amplification by sampling: the server knows who takes part). Both halves compute
    it from the run config, so they agree without a message; a process keeps the answer (the bisection calls the
    accountant a few dozen times: seconds, which every training message would pay)."""
    if noise_multiplier > 0:
        return noise_multiplier
    return noise_for_epsilon(target_epsilon, 1.0, rounds, delta)


class PrivacyLedger:
    """Each client's rho so far (zCDP composes by addition over the rounds its contribution was in the sum); the
    run's epsilon is the most-spent client's."""

    def __init__(self, delta: float, spent: dict[int, float] | None = None) -> None:
        self.delta = delta
        self.spent: dict[int, float] = dict(spent or {})

    def record(self, clients: list[int], rho: float) -> None:
        """One round's rho charged to each client in its sum."""
        for pid in clients:
            self.spent[pid] = self.spent.get(pid, 0.0) + rho

    def epsilon(self) -> float:
        """The largest epsilon at delta over the clients so far."""
        return zcdp_epsilon(max(self.spent.values(), default=0.0), self.delta)
