"""SecAgg+'s run-config parameters (Flower's `SecAggPlusWorkflow` meanings), checked, and resolved for a cohort.

Two checks go beyond Flower's, because a setting Flower accepts would break the promise that the server learns
only the sum:
- the reconstruction threshold must be more than half of the shares: at half or less, a server can collect a
  client's self-mask seed from one half of its neighbours and its mask key from the other half (each neighbour
  answering only one kind, as a correct client does) and unmask that client's vector alone (Bell et al., "Secure
  Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS 2020, Sec. 3: t > k/2 against such a server);
- the modulus must hold the sum of the whole cohort (clients x quantization range), where Flower checks the number
  of shares only, so a round of more than modulus / quantization-range clients wraps around silently there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SECAGG_MODES = ("none", "secaggplus")
_OWN_MODELS = "its server needs each client's own model, which the sum of the uploads does not give"
# Algorithms run-config `secagg` refuses, and why (docs/privacy.md's support table).
SECAGG_REFUSED = {
    "local": "nothing leaves the clients, there is nothing to aggregate",
    "fedamp": f"{_OWN_MODELS} (the attentive cloud model of each client)",
    "heurfedamp": f"{_OWN_MODELS} (the attentive cloud model of each client)",
    "fedfomo": f"{_OWN_MODELS} (each client combines the others' models)",
    "fliu": f"{_OWN_MODELS} (the individualized updates)",
    "dapperfl": "its server aggregates each device's pruned model on that device's own support, which differs by "
    "device and is not known before the round",
}
MAX_MODULUS = 2**64  # the masked arithmetic is uint64's, exact modulo any power of two up to 2**64


@dataclass(frozen=True)
class SecAggParams:
    """`num_shares` and `reconstruction_threshold`: an int (a count) or a float in (0, 1] (a fraction of the
    cohort, and of the shares), as in Flower; the ranges as in Flower; `max_weight`: the sample count that maps to
    the full quantization range (a client's count above it is capped and says so)."""

    num_shares: int | float = 1.0
    reconstruction_threshold: int | float = 0.67
    clipping_range: float = 8.0
    quantization_range: int = 4194304
    modulus_range: int = 4294967296
    max_weight: float = 1000.0

    def problems(self) -> list[str]:
        """What is wrong with these parameters, one line each (empty when they are usable)."""
        out = []
        for name in ("num_shares", "reconstruction_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                out.append(f"secagg-{name.replace('_', '-')} must be a number, not {value!r}")
            elif isinstance(value, float) and not 0 < value <= 1:
                out.append(f"secagg-{name.replace('_', '-')} as a fraction must lie in (0, 1], not {value}")
            elif isinstance(value, int) and value < 1:
                out.append(f"secagg-{name.replace('_', '-')} as a count must be at least 1, not {value}")
        if isinstance(self.num_shares, int) and not isinstance(self.num_shares, bool) and 1 < self.num_shares < 3:
            out.append(f"secagg-num-shares as a count must be at least 3, not {self.num_shares}")
        if not (math.isfinite(self.clipping_range) and self.clipping_range > 0):
            out.append(f"secagg-clipping-range must be a positive number, not {self.clipping_range}")
        if not (math.isfinite(self.max_weight) and self.max_weight > 0):
            out.append(f"secagg max-weight must be a positive number, not {self.max_weight}")
        shares, threshold = self.num_shares, self.reconstruction_threshold
        if (
            isinstance(threshold, float)
            and threshold < 0.5
            or (isinstance(shares, int) and isinstance(threshold, int) and not shares // 2 < threshold <= shares)
        ):
            out.append(
                f"secagg-reconstruction-threshold {threshold} must be more than half of the shares ({shares}): at "
                "half or less a server can gather both secrets of one client and see its upload alone"
            )
        q, m = self.quantization_range, self.modulus_range
        if not isinstance(q, int) or q < 2:
            out.append(f"secagg-quantization-range must be an integer of at least 2, not {q!r}")
        if not isinstance(m, int) or m < 2 or m & (m - 1) or m > MAX_MODULUS:
            out.append(f"secagg-modulus-range must be a power of two up to 2**64, not {m!r}")
        elif isinstance(q, int) and m <= q:
            out.append(f"secagg-modulus-range ({m}) must be larger than secagg-quantization-range ({q})")
        return out

    def check(self) -> None:
        """Raise ValueError naming every problem."""
        if problems := self.problems():
            raise ValueError("; ".join(problems))

    def for_cohort(self, num_clients: int) -> Cohort:
        """The share count and threshold for a round of `num_clients`, or ValueError saying why none is safe."""
        self.check()
        if num_clients < 3:
            raise ValueError(f"secure aggregation needs at least 3 clients in a round, not {num_clients}")
        if isinstance(self.num_shares, float):
            shares = max(3, round(self.num_shares * num_clients))
        else:
            shares = self.num_shares
        shares = min(shares, num_clients)
        if shares < num_clients and shares % 2 == 0:
            shares += 1  # the ring of neighbours is symmetric: an odd count (itself and k/2 on each side)
        if isinstance(self.reconstruction_threshold, float):
            threshold = math.ceil(self.reconstruction_threshold * shares)
        else:
            threshold = self.reconstruction_threshold
        if not shares // 2 < threshold <= shares:
            raise ValueError(
                f"secagg-reconstruction-threshold gives {threshold} of {shares} shares: it must be more than half "
                "of the shares (else a server can gather both secrets of one client and see its vector alone) "
                "and at most all of them"
            )
        self.check_sum(num_clients, self.quantization_range)
        return Cohort(num_clients, shares, threshold, self)

    def check_sum(self, num_clients: int, largest: int) -> None:
        """ValueError when the sum of `num_clients` values of up to `largest` could wrap around the modulus."""
        if num_clients * largest >= self.modulus_range:
            raise ValueError(
                f"secagg-modulus-range {self.modulus_range} cannot hold the sum of {num_clients} clients' values "
                f"of up to {largest}: raise it to at least {1 << (num_clients * largest).bit_length()}"
            )


@dataclass(frozen=True)
class Cohort:
    """A round's resolved SecAgg+ setting: how many clients, how many shares (neighbours, itself included) each
    client makes, how many of them rebuild a secret."""

    num_clients: int
    shares: int
    threshold: int
    params: SecAggParams
