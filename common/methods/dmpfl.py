"""DM-PFL math (DM-PFL [KDD 2023] Sec. 3): phase schedule, Eq. 4 composition, Eq. 5 aggregation, global mask, Alg. 4.

Paper: Zhang, Zhou, Wang, Tong, "DM-PFL: Hitchhiking Generic Federated Learning for Efficient Shift-Robust
Personalization", KDD 2023, doi:10.1145/3580305.3599311 (not on arXiv)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from common.algorithms import SIMILARITIES
from common.learning.evaluate import entropy
from common.methods.aggregate import blocks, flat, weighted_sum
from common.methods.masked_ops import gather, keep, scatter, select
from common.methods.masks import topk_mask
from common.storage.pages import new_store
from common.wire.codec import decode_model, encode_model, mask_digest, pack_mask, unpack_mask
from common.wire.validation import PayloadError

Named = dict[str, np.ndarray]
PARTIAL = "global-partial"  # the record of a partial download (w_g on m_g AND m_c)


def phase_schedule(num_rounds: int, iterations: int, layout: str = "halves") -> list[int]:
    """Phase (1, 2 or 3) of each round 1..T: `iterations` cycles of round(T/I) rounds.

    `thirds`: each cycle split equally into phases 1, 2, 3 (segment k of the 3*I segments holds rounds
    round(k*T/(3I)) + 1 .. round((k+1)*T/(3I))). `halves`: the paper's "two-phased pipeline" (Sec. 3.3.1, 4.3.2):
    a cycle's rounds but its last split equally between phase 1 and phase 2 (phase 1 takes the odd one), and its
    last round is phase 3 (Alg. 3 has no round loop: it runs once, between cycles); a run too short for I cycles of
    at least 3 rounds runs `cycles_that_fit` of them (at least one).
    iterations = 0 means phase 1 only (the paper's ablation).
    """
    if iterations <= 0:
        return [1] * num_rounds
    if layout not in ("thirds", "halves"):
        raise ValueError(f"unknown phase layout {layout!r}")
    phases = []
    if layout == "thirds":
        segments = 3 * iterations
        bounds = [round(k * num_rounds / segments) for k in range(segments + 1)]
        for k in range(segments):
            phases.extend([k % 3 + 1] * (bounds[k + 1] - bounds[k]))
        return phases
    cycles = cycles_that_fit(num_rounds, iterations)
    bounds = [round(k * num_rounds / cycles) for k in range(cycles + 1)]
    for k in range(cycles):
        length = bounds[k + 1] - bounds[k]
        if length <= 1:  # a one-round run trains masks: phase 1
            phases.extend([1] * length)
            continue
        first = length // 2
        phases.extend([1] * first + [2] * (length - 1 - first) + [3])
    return phases


def cycles_that_fit(num_rounds: int, iterations: int) -> int:
    """How many of the `iterations` cycles of the `halves` layout a run of `num_rounds` holds with at least 3 rounds
    each (phases 1, 2 and 3), and at least one."""
    return max(1, min(iterations, num_rounds // 3))


def phase3_starts(phases: Sequence[int]) -> set[int]:
    """The rounds (1-based) that open a run of phase-3 rounds: where Alg. 3's reset of w_c takes place."""
    return {r for r, p in enumerate(phases, start=1) if p == 3 and (r == 1 or phases[r - 2] != 3)}


def reset_personal_only(w_c: np.ndarray, m_g: np.ndarray, m_c: np.ndarray) -> np.ndarray:
    """Alg. 3 line 3 on one layer's personal weights: the positions of m_c AND NOT m_g set to 0 (w_c <- w_g on
    m_g AND m_c, where Eq. 4 reads w_g anyway)."""
    return np.where(m_c & ~m_g, np.float32(0.0), w_c).astype(w_c.dtype, copy=False)


def compose_personal(w_g: np.ndarray, m_g: np.ndarray, w_c: np.ndarray, m_c: np.ndarray) -> np.ndarray:
    """Eq. 4: theta_c = w_g * (m_g AND m_c) + w_c * (m_c AND NOT m_g); zero outside m_c."""
    return select(m_c & m_g, w_g, keep(m_c, w_c))


def compose_global(w_g: np.ndarray, m_g: np.ndarray) -> np.ndarray:
    """theta_g = w_g * m_g."""
    return keep(m_g, w_g)


class PersonalMaskStore:
    """Each client's m_c as packed bits, one row per client (d/8 bytes): in memory, or in a memory-mapped file when
    given a path, so the server's memory does not grow with the clients. Rows are made on first use."""

    def __init__(
        self, partition_ids: Sequence[int], shapes: Mapping[str, tuple[int, ...]], path: Path | None = None
    ) -> None:
        self.rows = {pid: row for row, pid in enumerate(partition_ids)}
        self.shapes = dict(shapes)
        self.spans: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, shape in self.shapes.items():
            width = math.ceil(math.prod(shape) / 8)
            self.spans[name] = (offset, offset + width)
            offset += width
        self.path = path
        self.width = offset
        self.bits: np.ndarray | None = None
        self.known = np.zeros(len(self.rows), dtype=bool)

    def _table(self) -> np.ndarray:
        if self.bits is None:
            shape = (len(self.rows), self.width)
            self.bits = new_store(self.path, np.uint8, shape) if self.path is not None else np.zeros(shape, np.uint8)
        return self.bits

    def put(self, partition_id: int, masks: Mapping[str, np.ndarray]) -> None:
        """Keep a client's masks (a client without a row is not kept: it gets whole downloads)."""
        row = self.rows.get(partition_id)
        if row is None or set(masks) != set(self.shapes):
            return
        table = self._table()
        for name, (start, end) in self.spans.items():
            table[row, start:end] = pack_mask(np.asarray(masks[name], bool))
        self.known[row] = True

    def get(self, partition_id: int) -> dict[str, np.ndarray] | None:
        """A client's masks, or None when not known."""
        row = self.rows.get(partition_id)
        if row is None or not self.known[row] or self.bits is None:
            return None
        return {
            name: unpack_mask(np.array(self.bits[row, start:end]), self.shapes[name])
            for name, (start, end) in self.spans.items()
        }

    def forget(self, partition_id: int) -> None:
        """Drop what is known of a client's masks."""
        row = self.rows.get(partition_id)
        if row is not None:
            self.known[row] = False

    def state(self) -> dict[str, np.ndarray]:
        """What a checkpoint keeps: the partition id of each row, which rows are known, and the packed rows (the
        memory-mapped table itself, streamed by the checkpoint writer; no rows while none was ever kept)."""
        ids = np.array(sorted(self.rows, key=self.rows.__getitem__), dtype=np.int64)
        bits = self.bits if self.bits is not None else np.zeros((0, self.width), np.uint8)
        return {"ids": ids, "known": self.known.copy(), "bits": bits}

    def restore(self, state: Mapping[str, np.ndarray]) -> None:
        """Keep the known rows of `state` (from `state()`) for the clients this store has rows for; ValueError when
        it does not fit these layers."""
        ids, known, bits = (np.asarray(state[key]) for key in ("ids", "known", "bits"))
        if (
            ids.ndim != 1
            or known.shape != ids.shape
            or known.dtype != bool
            or bits.dtype != np.uint8
            or bits.ndim != 2
            or bits.shape[1] != self.width
            or (known.any() and bits.shape[0] != len(ids))
        ):
            raise ValueError("checkpoint's personal masks do not match the configured model")
        for index in np.flatnonzero(known):
            row = self.rows.get(int(ids[index]))
            if row is not None:
                self._table()[row] = bits[index]
                self.known[row] = True

    def close(self) -> None:
        """Delete the memory-mapped file, if any."""
        if isinstance(self.bits, np.memmap) and self.path is not None:
            self.bits = None
            self.path.unlink(missing_ok=True)


def masks_digest(masks: Mapping[str, np.ndarray]) -> int:
    """One 63-bit digest of a model's masks (layers in name order): what a client checks a partial download against."""
    return mask_digest(np.concatenate([np.asarray(masks[name], bool).ravel() for name in sorted(masks)]))


def encode_partial_global(
    w_g: Mapping[str, np.ndarray], m_g: Mapping[str, np.ndarray], m_c: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The part of theta_g a client with mask m_c uses in phases 1 and 3 (Eq. 4 reads w_g only on m_g AND m_c), in
    the one codec: per masked layer, bits over m_c's positions (which are in m_g) and the values there; dense
    layers whole."""
    dense = {name: (gather(w, m_c[name]) if name in m_c else w) for name, w in w_g.items()}
    return encode_model(dense, {name: np.compress(np.ravel(m_c[name]), np.ravel(m_g[name])) for name in m_c})


def decode_partial_global(
    arrays: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]], m_c: Mapping[str, np.ndarray]
) -> tuple[Named, Named]:
    """(w_g on m_g AND m_c with zeros elsewhere, m_g AND m_c) from encode_partial_global's arrays, validated."""
    expected = {name: ((int(m_c[name].sum()),) if name in m_c else tuple(shape)) for name, shape in shapes.items()}
    values, inner = decode_model(arrays, expected)
    if set(inner) != set(m_c):
        raise PayloadError(f"partial global model has sparse layers {sorted(inner)}, expected {sorted(m_c)}")
    weights: Named = {}
    masks: Named = {}
    for name in shapes:
        if name not in m_c:
            weights[name] = values[name]
            continue
        weights[name], masks[name] = scatter(values[name], m_c[name]), scatter(inner[name], m_c[name], bool)
    return weights, masks


def aggregate_masked(
    w_g: np.ndarray, values: Sequence[np.ndarray], masks: Sequence[np.ndarray], sizes: Sequence[float]
) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 5 for one layer: on the union of the masks, sum_c |D_c| w_c m_c / sum_c |D_c| m_c; elsewhere the old w_g.

    `values`: each client's w_c at its mask's set positions (row-major), as the upload carries them. Returns (new
    w_g, vote counts = number of client masks holding each position). Accumulated in client order a cache-sized
    block of positions at a time, each client's block scattered there (the same bits as whole-layer sums over
    dense uploads, without a dense tensor per upload or a trip to memory for every client)."""
    old = flat(w_g)
    flat_masks = [flat(m) for m in masks]
    for v, m in zip(values, flat_masks, strict=True):
        if m.size != old.size or np.ndim(v) != 1 or np.size(v) != np.count_nonzero(m):
            raise ValueError(f"a client's mask has {m.size} positions ({old.size} expected) for {np.size(v)} values")
    out = np.empty(old.size, np.float32)
    votes = np.empty(old.size, np.int64)
    taken = [0] * len(values)  # values of each client used by the blocks so far
    for part in blocks(old.size):
        numerator = np.zeros(part.stop - part.start, np.float64)
        denominator = np.zeros_like(numerator)
        count = np.zeros(part.stop - part.start, np.int64)
        for client, (v_c, m_c, size) in enumerate(zip(values, flat_masks, sizes, strict=True)):
            block = m_c[part]
            positions = np.flatnonzero(block)
            w_c = np.zeros(block.size, np.float32)
            w_c[positions] = v_c[taken[client] : taken[client] + positions.size]
            taken[client] += positions.size
            numerator += size * w_c
            denominator += size * block
            count += block
        covered = denominator > 0
        out[part] = np.where(covered, numerator / np.where(covered, denominator, 1.0), old[part])
        votes[part] = count
    return out.reshape(w_g.shape), votes.reshape(w_g.shape)


def select_global_mask(
    w_g: np.ndarray, votes: np.ndarray, num_received: int, density: float, min_vote_fraction: float
) -> np.ndarray:
    """New m_g of one layer: the top `density` fraction of |w_g| among positions with votes > fraction * received.

    Positions failing the vote are never selected, so the layer may end up sparser than `density`.
    """
    eligible = votes > min_vote_fraction * num_received
    return topk_mask(torch.from_numpy(w_g), density, torch.from_numpy(eligible)).numpy()


def aggregate_round(
    w_g: Mapping[str, np.ndarray],
    replies: Sequence[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray], float]],
    densities: Mapping[str, float],
    min_vote_fraction: float,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Phase-1 server step on a whole model: Eq. 5 on masked layers, size-weighted mean on dense ones, new m_g.

    replies: (client weights: the masked layers as their values on the client's mask, the others dense; client
    masks of the masked layers; |D_c|) per client.
    """
    new_w: dict[str, np.ndarray] = {}
    new_m: dict[str, np.ndarray] = {}
    sizes = [size for _, _, size in replies]
    for name, old in w_g.items():
        weights = [w[name] for w, _, _ in replies]
        if name in densities:
            new_w[name], votes = aggregate_masked(old, weights, [m[name] for _, m, _ in replies], sizes)
            new_m[name] = select_global_mask(new_w[name], votes, len(replies), densities[name], min_vote_fraction)
        else:
            new_w[name] = (weighted_sum(weights, sizes) / float(sum(sizes))).astype(np.float32)
    return new_w, new_m


class AdaptiveModel(torch.nn.Module):
    """DM-PFL+ as one model: per sample the logits of theta_c or theta_g, whichever Alg. 4 picks (so the argmax
    is its prediction). Alg. 4 reads each model's logits over its temperature (1: the models as they are, the
    paper's reading; the base entropies must then be those of the same calibrated models)."""

    def __init__(
        self,
        personal: torch.nn.Module,
        shared: torch.nn.Module,
        base_entropy_c: float,
        base_entropy_g: float,
        similarity: str = "softmax",
        temperature_c: float = 1.0,
        temperature_g: float = 1.0,
    ) -> None:
        super().__init__()
        self.personal, self.shared = personal, shared
        self.base_entropy_c, self.base_entropy_g = base_entropy_c, base_entropy_g
        self.similarity = similarity
        self.temperature_c, self.temperature_g = temperature_c, temperature_g

    def chooses_personal(self, logits_c: torch.Tensor, logits_g: torch.Tensor) -> torch.Tensor:
        """Per sample, whether Alg. 4 picks theta_c on these logits."""
        _, use_personal = adaptive_predict(
            logits_c / self.temperature_c,
            logits_g / self.temperature_g,
            self.base_entropy_c,
            self.base_entropy_g,
            self.similarity,
        )
        return use_personal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the model Alg. 4 chooses for each sample."""
        logits_c, logits_g = self.personal(x), self.shared(x)
        return torch.where(self.chooses_personal(logits_c, logits_g)[:, None], logits_c, logits_g)


def adaptive_predict(
    logits_c: torch.Tensor,
    logits_g: torch.Tensor,
    base_entropy_c: float,
    base_entropy_g: float,
    similarity: str = "softmax",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Alg. 4 per sample: use theta_c when E_c - (1-Sim) BE_c < E_g - (1-Sim) BE_g, else theta_g.

    Entropies are taken on the softmax outputs, the cosine similarity on the softmax outputs (`softmax`, the
    paper's reading) or on the logits (`logits`). Returns (predictions, used_personal).
    """
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity {similarity!r}: one of {', '.join(SIMILARITIES)}")
    p_c, p_g = torch.softmax(logits_c, dim=1), torch.softmax(logits_g, dim=1)
    a, b = (p_c, p_g) if similarity == "softmax" else (logits_c, logits_g)
    cosine = torch.nn.functional.cosine_similarity(a, b, dim=1)
    score_c = entropy(p_c) - (1 - cosine) * base_entropy_c
    score_g = entropy(p_g) - (1 - cosine) * base_entropy_g
    use_personal = score_c < score_g
    return torch.where(use_personal, logits_c.argmax(1), logits_g.argmax(1)), use_personal


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor, iterations: int = 80) -> float:
    """Temperature scaling (Guo et al., "On Calibration of Modern Neural Networks", ICML 2017): the T > 0 that
    minimizes the negative log-likelihood of softmax(logits / T) on (logits, labels). The NLL is convex in 1 / T,
    so a golden-section search over log(1 / T) in [-5, 5] (T from 0.0067 to 148) finds it; 1.0 without data."""
    if len(labels) == 0:
        return 1.0
    z, y = logits.double(), labels.long()

    def nll(log_beta: float) -> float:
        return float(torch.nn.functional.cross_entropy(z * math.exp(log_beta), y))

    low, high = -5.0, 5.0
    ratio = (math.sqrt(5) - 1) / 2
    a, b = high - ratio * (high - low), low + ratio * (high - low)
    fa, fb = nll(a), nll(b)
    for _ in range(iterations):
        if fa <= fb:
            high, b, fb = b, a, fa
            a = high - ratio * (high - low)
            fa = nll(a)
        else:
            low, a, fa = a, b, fb
            b = low + ratio * (high - low)
            fb = nll(b)
    return float(math.exp(-(low + high) / 2))


@dataclass(frozen=True)
class SelectorStats:
    """What DM-PFL+'s selector needs of one model on one client: its base entropy (Alg. 4), the temperature fitted
    on the client's training data, and the base entropy of the model so calibrated."""

    base_entropy: float
    temperature: float
    base_entropy_calibrated: float

    def as_arrays(self) -> Named:
        """The client-state form."""
        return {
            "be": np.array([self.base_entropy], np.float64),
            "t": np.array([self.temperature], np.float64),
            "be-t": np.array([self.base_entropy_calibrated], np.float64),
        }

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray] | None) -> SelectorStats | None:
        """From the client-state form; None where there is none (or one kept before calibration existed)."""
        if arrays is None or "t" not in arrays or "be-t" not in arrays:
            return None
        return cls(float(arrays["be"][0]), float(arrays["t"][0]), float(arrays["be-t"][0]))


def selector_stats(
    train_logits: torch.Tensor, train_labels: torch.Tensor, entropy_logits: torch.Tensor | None = None
) -> SelectorStats:
    """A model's SelectorStats: its temperature fitted on its training logits and labels (fit_temperature), and its
    mean prediction entropy as it is and calibrated, on `entropy_logits` (default: the training logits)."""
    temperature = fit_temperature(train_logits, train_labels)
    z = train_logits if entropy_logits is None else entropy_logits
    as_is = float(entropy(torch.softmax(z, 1)).mean())
    return SelectorStats(as_is, temperature, float(entropy(torch.softmax(z / temperature, 1)).mean()))


def make_selector(
    personal: torch.nn.Module,
    shared: torch.nn.Module,
    stats_c: SelectorStats,
    stats_g: SelectorStats,
    similarity: str = "softmax",
    calibrated: bool = False,
) -> AdaptiveModel:
    """DM-PFL+ for one pair: Alg. 4 on the models as they are (the paper's reading), or on both calibrated by their
    temperatures with the calibrated base entropies."""
    if not calibrated:
        return AdaptiveModel(personal, shared, stats_c.base_entropy, stats_g.base_entropy, similarity)
    return AdaptiveModel(
        personal,
        shared,
        stats_c.base_entropy_calibrated,
        stats_g.base_entropy_calibrated,
        similarity,
        stats_c.temperature,
        stats_g.temperature,
    )


def disagreements(
    logits_c: torch.Tensor, logits_g: torch.Tensor, use_personal: torch.Tensor, labels: torch.Tensor
) -> dict[str, np.ndarray]:
    """Per sample, where theta_c and theta_g predict different labels: `disagree`, and among those `to-c` (the
    selector took theta_c), `c-right` (theta_c is right), `g-right` (theta_g is right); boolean arrays, so any
    share of them (at a shift degree) is a mean over the samples, and a share among the disagreements a ratio of
    two of them."""
    pred_c, pred_g = logits_c.argmax(1), logits_g.argmax(1)
    differ = pred_c != pred_g
    return {
        "disagree": differ.numpy(),
        "to-c": (differ & use_personal).numpy(),
        "c-right": (differ & (pred_c == labels)).numpy(),
        "g-right": (differ & (pred_g == labels)).numpy(),
    }
