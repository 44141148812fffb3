"""A client's contribution as one vector of integers modulo the SecAgg+ modulus, and the sum's way back.

The vector is the client's weight (its sample count in quantization units, so the server learns only the cohort's
total) followed by named sections: `real` sections carry weight-scaled values quantized as Flower's
`flwr.common.secure_aggregation.quantization` does (clip to [-c, c], shift, scale to the quantization range,
stochastic rounding), `integer` sections carry exact bounded counts (per-coordinate weights for masked averaging,
mask votes), `signed` sections carry a client's own integers of either sign (distributed DP's noised contribution),
as residues modulo the modulus, their sum read back centred (in (-modulus / 2, modulus / 2)). The stochastic
rounding draws from a generator the caller seeds, where Flower's draws from NumPy's global one (a run could not
repeat)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .params import SecAggParams

WEIGHT = "weight"


@dataclass(frozen=True)
class Section:
    """One named part of the vector: `size` coordinates, `real` (quantized), `integer` (each client's values
    in [0, bound]) or `signed` (any int64: whoever builds them keeps the cohort's sum within half the modulus)."""

    name: str
    size: int
    kind: Literal["real", "integer", "signed"] = "real"
    bound: int = 0


@dataclass(frozen=True)
class Layout:
    """The vector's sections in order, after the weight: the server knows it before the round."""

    sections: tuple[Section, ...]
    offsets: dict[str, slice] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        offsets, start = {}, 1
        for section in self.sections:
            if section.name in offsets or section.name == WEIGHT:
                raise ValueError(f"section name {section.name!r} is used twice or reserved")
            if section.size < 0 or (section.kind == "integer" and section.bound < 1):
                raise ValueError(f"section {section.name!r}: size {section.size}, bound {section.bound}")
            offsets[section.name] = slice(start, start + section.size)
            start += section.size
        object.__setattr__(self, "offsets", offsets)

    @property
    def size(self) -> int:
        """Coordinates in the vector, the weight included."""
        return 1 + sum(section.size for section in self.sections)

    def check_cohort(self, num_clients: int, params: SecAggParams) -> None:
        """ValueError when the sum of `num_clients` vectors could wrap around the modulus."""
        largest = max([params.quantization_range] + [s.bound for s in self.sections if s.kind == "integer"])
        params.check_sum(num_clients, largest)


def weight_units(weight: float, params: SecAggParams) -> tuple[int, bool]:
    """A sample count in quantization units (max-weight = the full range; at least 1 for a positive count) and
    whether it was capped at max-weight."""
    if not np.isfinite(weight) or weight < 0:
        raise ValueError(f"a client's weight must be a finite count of at least 0, not {weight}")
    capped = weight > params.max_weight
    units = round(min(weight, params.max_weight) / params.max_weight * params.quantization_range)
    return (max(units, 1) if weight > 0 else 0), capped


def stochastic_round(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """floor(v) + 1 with probability v - floor(v), else floor(v): unbiased, as int64."""
    low = np.floor(values)
    return (low + (rng.random(values.shape) < values - low)).astype(np.int64)


def encode(
    layout: Layout,
    values: Mapping[str, np.ndarray],
    weight: float,
    params: SecAggParams,
    rng: np.random.Generator,
    units: int | None = None,
) -> tuple[np.ndarray, bool]:
    """The client's vector (uint64, each entry below the modulus) and whether its weight was capped; `units`: the
    weight coordinate as given (distributed DP counts every client once) instead of `weight` in units.

    A real section holds (units / Q) * x clipped to [-c, c] and mapped to [0, Q]; an integer section holds the
    values as they are; a signed section its values modulo the modulus."""
    if units is None:
        units, capped = weight_units(weight, params)
    else:
        capped = False
    out = np.empty(layout.size, np.uint64)
    out[0] = units
    clip, q = params.clipping_range, params.quantization_range
    for section in layout.sections:
        given = np.asarray(values[section.name])
        if given.size != section.size:
            raise ValueError(f"section {section.name!r}: {given.size} values for {section.size} coordinates")
        flat = given.reshape(-1)
        if section.kind == "signed":
            if not np.issubdtype(flat.dtype, np.integer):
                raise ValueError(f"section {section.name!r} takes integers, not {flat.dtype}")
            # two's complement is the residue modulo 2**64; the power-of-two modulus keeps its low bits
            out[layout.offsets[section.name]] = reduce(flat.astype(np.int64).view(np.uint64), params.modulus_range)
            continue
        if section.kind == "integer":
            if not np.issubdtype(flat.dtype, np.integer) and not np.issubdtype(flat.dtype, np.bool_):
                raise ValueError(f"section {section.name!r} takes integers, not {flat.dtype}")
            if flat.size and (flat.min() < 0 or flat.max() > section.bound):
                raise ValueError(f"section {section.name!r}: values outside [0, {section.bound}]")
            out[layout.offsets[section.name]] = flat.astype(np.uint64)
            continue
        real = flat.astype(np.float64)
        if not np.all(np.isfinite(real)):
            raise ValueError(f"section {section.name!r} holds values that are not finite")
        scaled = (np.clip(real * (units / q), -clip, clip) + clip) * (q / (2 * clip))
        out[layout.offsets[section.name]] = np.clip(stochastic_round(scaled, rng), 0, q).astype(np.uint64)
    return out, capped


@dataclass(frozen=True)
class Decoded:
    """The cohort's sum: total weight (in units and as a fraction of max-weight's units), per real section the sum
    of (units / Q) * x over the clients, per integer section the plain sum (a signed section's centred)."""

    weight_units: int
    reals: dict[str, np.ndarray]
    integers: dict[str, np.ndarray]
    quantization_range: int

    def samples(self, max_weight: float) -> float:
        """The cohort's total sample count, as its weight units give it back (max-weight = the full range)."""
        return self.weight_units / self.quantization_range * max_weight

    def mean(self, name: str) -> np.ndarray:
        """A real section's weighted mean over every client that sent it (the cohort's total weight)."""
        if self.weight_units <= 0:
            raise ValueError("the cohort's total weight is 0")
        return self.reals[name] * (self.quantization_range / self.weight_units)

    def masked_mean(self, name: str, weights: str, fallback: np.ndarray) -> np.ndarray:
        """A real section's mean per coordinate over the clients that sent that coordinate, given the integer
        section `weights` summing each client's units times its 0/1 mask; `fallback` where no client sent it."""
        denominator = self.integers[weights].astype(np.float64)
        covered = denominator > 0
        mean = self.reals[name] * self.quantization_range / np.where(covered, denominator, 1.0)
        return np.where(covered, mean, np.asarray(fallback, np.float64).reshape(-1))


def decode(layout: Layout, total: np.ndarray, num_clients: int, params: SecAggParams) -> Decoded:
    """The unmasked sum of `num_clients` vectors (already reduced modulo the modulus) back to sums."""
    if total.shape != (layout.size,):
        raise ValueError(f"a sum of shape {total.shape} for a layout of {layout.size} coordinates")
    clip, q = params.clipping_range, params.quantization_range
    reals, integers = {}, {}
    for section in layout.sections:
        part = total[layout.offsets[section.name]]
        if section.kind == "integer":
            integers[section.name] = part.astype(np.int64)
        elif section.kind == "signed":
            integers[section.name] = centred(part, params.modulus_range)
        else:
            reals[section.name] = part.astype(np.float64) * (2 * clip / q) - num_clients * clip
    return Decoded(int(total[0]), reals, integers, q)


def centred(residues: np.ndarray, modulus: int) -> np.ndarray:
    """Residues modulo a power of two read as the integers in [-modulus / 2, modulus / 2), int64."""
    values = np.asarray(residues, np.uint64)
    if modulus == 2**64:
        return values.view(np.int64)
    signed = values.astype(np.int64)
    return np.where(signed >= modulus // 2, signed - modulus, signed)


def plain_sum(vectors: Sequence[np.ndarray], params: SecAggParams) -> np.ndarray:
    """The sum modulo the modulus of unmasked vectors: what the protocol must give back exactly."""
    out = np.zeros_like(vectors[0], dtype=np.uint64)
    for vector in vectors:
        out += vector.astype(np.uint64)
    return reduce(out, params.modulus_range)


def reduce(vector: np.ndarray, modulus: int) -> np.ndarray:
    """uint64 arithmetic wraps modulo 2**64, so a power-of-two modulus is one bitwise and."""
    return vector if modulus == 2**64 else vector & np.uint64(modulus - 1)
