"""Client-level differential privacy of the uploads, on plain numpy arrays.

- Each client's update is clipped on the coordinates it sends.
- Gaussian noise goes only on the coordinates the server knows every client shares, so a sparse aggregate stays
  sparse.
- The privacy accountant is dp-accounting's RDP accountant for the sampled Gaussian mechanism. A helper finds the
  noise multiplier that meets a target epsilon.
- The adaptive clip bound is the quantile rule of Andrew et al., "Differentially Private Learning with Adaptive
  Clipping", NeurIPS 2021 (arXiv:1905.03871).
- The mean over a fixed number of clients with noise of std z * C / n is DP-FedAvg's, from McMahan et al., "Learning
  Differentially Private Recurrent Language Models", ICLR 2018 (arXiv:1710.06963).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

DP_MODES = ("none", "central", "local", "distributed")

# Algorithms whose server keeps or compares each client's own model: a noised average would not protect them.
_OWN_MODELS = "its server needs each client's own model, which a noised average of the clients does not give"
CENTRAL_DP_REFUSED = {
    "fedamp": f"{_OWN_MODELS} (the attentive cloud model of each client)",
    "heurfedamp": f"{_OWN_MODELS} (the attentive cloud model of each client)",
    "fedfomo": f"{_OWN_MODELS} (each client combines the others' models)",
    "fliu": f"{_OWN_MODELS} (the individualized updates)",
}

# Sparse algorithms whose server averages on the global mask: central DP noises m_g's positions, and m_g stays at its
# seeded, data-independent start (the server's vote over the clients' masks is left out, as it would release them);
# local DP noises each upload on the positions it carries.
CENTRAL_DP_ON_GLOBAL_MASK = ("dmpfl", "feddst")

# Pruned uploads the server recovers to full shape from its previous model (DapperFL, Eq. 6: the update is 0 on what
# a client pruned): central DP clips each recovered update and noises every coordinate of the released model; local
# DP clips and noises the pruned model's update against the global model cut to the same channels (the same norm).
CENTRAL_DP_RECOVERED = ("dapperfl",)

Update = Sequence[np.ndarray]
Support = Sequence[np.ndarray | None]  # per array: the boolean mask of the coordinates sent (None: every one)

ACCOUNTANT_HINT = "pip install 'pflower[server]' (dp-accounting)"


def accountant_installed() -> bool:
    """Whether dp-accounting, the accountant of run-config `dp`, can be imported (a server install has it)."""
    import importlib.util

    return importlib.util.find_spec("dp_accounting") is not None


# Integer Renyi orders: the fractional ones near 1 fail to converge in dp-accounting for q around 0.1 (it warns and
# drops them); the integer range covers every (sigma, q, rounds) a federated run uses.
RDP_ORDERS = tuple(range(2, 257))


def _on(array: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """The array's values on the mask's coordinates (all of them without a mask), in float64."""
    values = np.asarray(array, dtype=np.float64)
    if mask is None:
        return values.reshape(-1)
    if mask.shape != values.shape or mask.dtype != np.bool_:
        raise ValueError(
            f"a support mask must be boolean of the array's shape {values.shape}, got {mask.dtype} {mask.shape}"
        )
    return values[mask]


def support_norm(update: Update, support: Support) -> float:
    """The update's L2 norm over the coordinates it sends."""
    return math.sqrt(sum(float(np.sum(_on(a, m) ** 2)) for a, m in zip(update, support, strict=True)))


def clip_on_support(update: Update, support: Support, bound: float) -> tuple[list[np.ndarray], float]:
    """The update scaled to norm at most `bound` over its support, zero off it (nothing it did not send is made up),
    in float64; and its norm before clipping."""
    if not math.isfinite(bound) or bound <= 0:
        raise ValueError(f"the clip bound must be a positive number, got {bound}")
    norm = support_norm(update, support)
    scale = min(1.0, bound / norm) if norm > 0 else 1.0
    out = []
    for array, mask in zip(update, support, strict=True):
        values = np.asarray(array, dtype=np.float64) * scale
        out.append(values if mask is None else np.where(mask, values, 0.0))
    return out, norm


def noise_on(
    shapes: Sequence[tuple[int, ...]], where: Support, std: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Gaussian noise of standard deviation `std` on the coordinates of `where` (every one where it is None), zero
    elsewhere."""
    out = []
    for shape, mask in zip(shapes, where, strict=True):
        noise = rng.normal(0.0, std, size=shape) if std > 0 else np.zeros(shape)
        out.append(noise if mask is None else np.where(mask, noise, 0.0))
    return out


def clipped_sum(
    updates: Sequence[Update],
    supports: Sequence[Support],
    bound: float,
    shapes: Sequence[tuple[int, ...]] | None = None,
) -> tuple[list[np.ndarray], list[float]]:
    """The sum of the updates, each clipped to `bound` on its support (float64), and each update's norm before;
    `shapes`: the arrays' shapes, for a sum of no update (zeros)."""
    if shapes is None:
        if not updates:
            raise ValueError("nothing to sum: give the arrays' shapes")
        shapes = [np.shape(a) for a in updates[0]]
    total = [np.zeros(shape) for shape in shapes]
    norms = []
    for update, support in zip(updates, supports, strict=True):
        bounded, norm = clip_on_support(update, support, bound)
        norms.append(norm)
        for acc, values in zip(total, bounded, strict=True):
            acc += values
    return total, norms


def central_dp_mean(
    updates: Sequence[Update],
    supports: Sequence[Support],
    shared: Support,
    bound: float,
    noise_multiplier: float,
    expected_clients: int,
    rng: np.random.Generator,
) -> tuple[list[np.ndarray], dict[str, float]]:
    """Central DP's aggregate of the round's updates (DP-FedAvg).

    Each update is clipped to `bound` on its support. They are summed and divided by `expected_clients`, a fixed
    number (the sampled clients a round plans), so that one client's presence moves the mean by at most
    bound / expected_clients. Gaussian noise of std noise_multiplier * bound / expected_clients goes on the `shared`
    coordinates only.

    A coordinate outside `shared` that a client sent is left out of the aggregate, since it would carry no noise.
    What it reports: the clip bound, the noise std and how many updates were clipped."""
    if expected_clients < 1:
        raise ValueError(f"expected_clients must be at least 1, got {expected_clients}")
    if noise_multiplier < 0:
        raise ValueError(f"the noise multiplier must be non-negative, got {noise_multiplier}")
    if not updates:
        raise ValueError("nothing to aggregate")
    total, norms = clipped_sum(updates, supports, bound)
    return noised_mean(total, norms, shared, bound, noise_multiplier, expected_clients, rng)


def noised_mean(
    total: list[np.ndarray],
    norms: Sequence[float],
    shared: Support,
    bound: float,
    noise_multiplier: float,
    expected_clients: int,
    rng: np.random.Generator,
) -> tuple[list[np.ndarray], dict[str, float]]:
    """central_dp_mean's second step: the clipped sum over `expected_clients` plus its noise on the shared
    coordinates (zero elsewhere); the report counts the updates whose `norms` exceeded the bound."""
    std = noise_multiplier * bound / expected_clients
    noise = noise_on([np.shape(a) for a in total], shared, std, rng)
    mean = []
    for acc, extra, mask in zip(total, noise, shared, strict=True):
        values = acc / expected_clients + extra
        mean.append(values if mask is None else np.where(mask, values, 0.0))
    clipped = sum(int(norm > bound) for norm in norms)
    return mean, {"clip_bound": bound, "noise_std": std, "clipped": float(clipped)}


def local_dp_update(
    update: Update, support: Support, bound: float, noise_multiplier: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Local DP: the client clips its update to `bound` on its support and adds noise of std
    noise_multiplier * bound there only, so the upload keeps its sparsity (its support itself is not hidden)."""
    bounded, _ = clip_on_support(update, support, bound)
    noise = noise_on([np.shape(a) for a in bounded], support, noise_multiplier * bound, rng)
    return [values + extra for values, extra in zip(bounded, noise, strict=True)]


def poisson_sample(ids: Sequence[int], rate: float, seed: int, index: int) -> list[int]:
    """Poisson sampling: each id independently with probability `rate`, drawn from (seed, index), so the sample's
    size varies and may be empty. It is the sampling the accountant's PoissonSampledDpEvent composes; the seed must
    be as secret as the noise's, or whoever knows it knows which rounds a client took part in, and the
    amplification by sampling that the epsilon counts on is gone."""
    if not 0 < rate <= 1:
        raise ValueError(f"the sample rate must lie in (0, 1], got {rate}")
    ordered = sorted(int(i) for i in ids)
    draws = np.random.default_rng([seed, index, 0x706F6973]).random(len(ordered))
    return [pid for pid, draw in zip(ordered, draws, strict=True) if draw < rate]


def epsilon(noise_multiplier: float, sample_rate: float, rounds: int, delta: float) -> float:
    """Epsilon at `delta` after `rounds` rounds of the Gaussian mechanism on client updates (noise multiplier z),
    each client taking part independently with probability `sample_rate` (Poisson sampling, as DP-FedAvg samples
    and as central DP's runs sample: `poisson_sample`), from dp-accounting's RDP accountant; inf without noise."""
    if not 0 < sample_rate <= 1:
        raise ValueError(f"the sample rate must lie in (0, 1], got {sample_rate}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if rounds <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    import dp_accounting
    from dp_accounting import rdp

    accountant = rdp.RdpAccountant(orders=list(RDP_ORDERS))
    step = dp_accounting.PoissonSampledDpEvent(sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier))
    accountant.compose(dp_accounting.SelfComposedDpEvent(step, rounds))
    return float(accountant.get_epsilon(delta))


def local_dp_epsilon(noise_multiplier: float, uploads: int, delta: float) -> float:
    """Local DP's epsilon at `delta` for a client after `uploads` noised uploads, under replace-one adjacency: one
    client's clipped update moves by at most 2C between two of its data sets, so noise of std z * C is a Gaussian
    mechanism of multiplier z / 2; no sampling amplifies it (the server sees who took part)."""
    return epsilon(noise_multiplier / 2, 1.0, uploads, delta)


def noise_for_epsilon(target: float, sample_rate: float, rounds: int, delta: float, tolerance: float = 0.005) -> float:
    """The smallest noise multiplier whose epsilon after `rounds` rounds is at most `target` (within `tolerance`,
    relative), by bisection on the accountant: epsilon falls as the noise grows."""
    if not math.isfinite(target) or target <= 0:
        raise ValueError(f"the target epsilon must be a positive number, got {target}")
    low, high = 0.0, 1.0
    while epsilon(high, sample_rate, rounds, delta) > target:
        low, high = high, 2 * high
        if high > 1e4:
            raise ValueError(f"no noise multiplier up to 1e4 reaches epsilon {target} in {rounds} rounds")
    while high - low > 1e-6:
        middle = (low + high) / 2
        reached = epsilon(middle, sample_rate, rounds, delta)
        if reached > target:
            low = middle
        else:
            high = middle
            if reached >= target * (1 - tolerance):
                break
    return high


def adaptive_clip_step(
    bound: float,
    below: Sequence[bool],
    target_quantile: float,
    learning_rate: float,
    count_noise_std: float,
    rng: np.random.Generator,
    expected_clients: float | None = None,
) -> float:
    """The next round's clip bound (Andrew et al. 2021, geometric update):
    C * exp(-learning_rate * (b - target_quantile)), where b is the noised fraction of this round's updates whose
    norm was at most C.

    Each indicator is shifted by -1/2 before it is summed (as the paper's reference code does), so one client's
    presence moves the sum by at most 1/2, the sensitivity `update_noise_multiplier`'s budget split assumes. The sum
    gets Gaussian noise of std `count_noise_std` and is divided by `expected_clients` (the planned clients a round,
    a fixed number like the updates' mean; default: the updates counted), then 1/2 is added back. With
    `expected_clients`, a round without updates still draws its noise (a Poisson sample may be empty: the round is
    the mechanism the accountant counts all the same)."""
    if not below and not expected_clients:
        return bound
    expected = float(expected_clients) if expected_clients else float(len(below))
    shifted = float(np.sum(np.asarray(below, dtype=np.float64) - 0.5))
    fraction = (shifted + rng.normal(0.0, count_noise_std)) / expected + 0.5
    return float(bound * math.exp(-learning_rate * (fraction - target_quantile)))


def count_noise_for(expected_clients: float, noise_multiplier: float) -> float:
    """The adaptive clip's count noise std: Andrew et al.'s m / 20, at least the run's noise multiplier z, so that
    the updates keep at least 87% of the budget (z_update <= 1.155 z) when few clients take part."""
    return max(expected_clients / 20, noise_multiplier)


def update_noise_multiplier(total: float, count_noise_std: float) -> float:
    """The updates' noise multiplier when the adaptive clip's count noise shares the budget of a total multiplier
    `total` (Andrew et al. 2021, section 3.1): (total^-2 - (2 * count_noise_std)^-2)^(-1/2)."""
    rest = total**-2 - (2 * count_noise_std) ** -2
    if rest <= 0:
        raise ValueError(
            f"the count noise (std {count_noise_std}) uses the whole budget of noise multiplier {total}: "
            "raise the count noise std"
        )
    return rest**-0.5


@dataclass(frozen=True)
class AdaptiveClip:
    """Andrew et al. 2021's adaptive clip bound: the target quantile of the update norms, the geometric step size,
    the std of the noise on the count of updates under the bound (0: `count_noise_for` the run's clients and
    noise multiplier, once that is solved), and the band [floor, ceiling] the bound is kept in (clamping the
    released, noised step is post-processing: the epsilon is unchanged)."""

    quantile: float
    learning_rate: float
    count_noise_std: float
    floor: float = 0.0  # the band the bound stays in (run-config dp-clip-band around dp-clip-norm): a colluding
    ceiling: float = math.inf  # majority that steers the count steers the bound only within it


class CentralDp:
    """A run's central DP: the noise multiplier (given, or solved for a target epsilon once, at the start) and the
    sampling rate the accountant composes (each client independently with probability expected / clients: the
    runner samples so, `poisson_sample`). Round k's noise comes from (noise_seed, k), so a resumed run draws the
    noise the uninterrupted one would have. The noise seed must be secret: anyone who knows it can subtract the
    noise (the server makes one from the OS unless a study fixes it, run-config `dp-noise-seed`).

    With `adaptive`, the clip bound follows the target quantile of the update norms. The count of updates under the
    bound is noised too, so the updates get the share of the noise budget that is left
    (`update_noise_multiplier`), and the accountant composes the total multiplier."""

    def __init__(
        self,
        noise_multiplier: float,
        target_epsilon: float,
        delta: float,
        expected_clients: int,
        num_clients: int,
        num_rounds: int,
        noise_seed: int,
        adaptive: AdaptiveClip | None = None,
    ) -> None:
        self.delta = delta
        self.expected_clients = expected_clients
        self.sample_rate = expected_clients / num_clients
        self.noise_multiplier = (
            noise_multiplier
            if noise_multiplier > 0
            else noise_for_epsilon(target_epsilon, self.sample_rate, num_rounds, delta)
        )
        if adaptive is not None and adaptive.count_noise_std <= 0:  # the documented default, from the solved z
            adaptive = replace(adaptive, count_noise_std=count_noise_for(expected_clients, self.noise_multiplier))
        self.adaptive = adaptive
        self.update_multiplier = (
            update_noise_multiplier(self.noise_multiplier, adaptive.count_noise_std)
            if adaptive
            else self.noise_multiplier
        )
        self.noise_seed = noise_seed

    def epsilon(self, rounds: int) -> float:
        """Epsilon at delta after `rounds` aggregated rounds."""
        return epsilon(self.noise_multiplier, self.sample_rate, rounds, self.delta)

    def aggregate(
        self,
        models: Sequence[Update],
        reference: Update,
        index: int,
        clip_bound: float,
        supports: Sequence[Support] | None = None,
        shared: Support | None = None,
    ) -> tuple[list[np.ndarray], dict[str, float]]:
        """The new model after aggregated round number `index` (0, 1, ...): reference + central_dp_mean of the
        updates clipped to `clip_bound`, float32; and its report: epsilon after this round included, and the next
        round's clip bound (`next_clip_bound`, the same one unless adaptive). No model at all (an empty Poisson
        sample, or every sampled client failed) releases the reference plus the noise.

        supports: per model, the coordinates it sent (default: every one); shared: the coordinates every client may
        send, the only ones noised (default: every one). Off `shared` the model stays the reference."""
        rng = np.random.default_rng([self.noise_seed, index, 0x6470])
        updates = [[np.asarray(m, np.float64) - r for m, r in zip(model, reference, strict=True)] for model in models]
        every: Support = [None] * len(reference)
        supports = supports if supports is not None else [every for _ in models]
        shared = shared if shared is not None else every
        total, norms = clipped_sum(updates, supports, clip_bound, [np.shape(r) for r in reference])
        mean, report = noised_mean(total, norms, shared, clip_bound, self.update_multiplier, self.expected_clients, rng)
        next_bound = clip_bound
        if self.adaptive is not None:
            below = [norm <= clip_bound for norm in norms]  # the norms the clip computed, not a second pass
            count_rng = np.random.default_rng([self.noise_seed, index, 0x636C])
            a = self.adaptive
            stepped = adaptive_clip_step(
                clip_bound, below, a.quantile, a.learning_rate, a.count_noise_std, count_rng, self.expected_clients
            )
            next_bound = min(max(stepped, a.floor), a.ceiling)
            if next_bound != stepped and a.floor < a.ceiling:  # a band of 1 fixes the bound on purpose
                report["clip_band_reached"] = True
        new = [(np.asarray(r, np.float64) + m).astype(np.float32) for r, m in zip(reference, mean, strict=True)]
        return new, {
            **report,
            "noise_multiplier": self.noise_multiplier,
            "delta": self.delta,
            "epsilon": self.epsilon(index + 1),
            "next_clip_bound": next_bound,
        }
