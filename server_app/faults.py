"""Simulated faults of a training round: which clients are told to fail (drop-rate) and whose replies count as
late (straggler-rate), chosen by (seed, purpose, round)."""

from __future__ import annotations

import numpy as np

from common.seeding import derive_seed


def choose_faulty(seed: int, server_round: int, candidates: list[int], count: int, purpose: str) -> set[int]:
    """A seeded choice of `count` of the candidates (all of them when fewer)."""
    if count <= 0 or not candidates:
        return set()
    rng = np.random.default_rng(derive_seed(seed, purpose, server_round))
    return {int(pid) for pid in rng.choice(sorted(candidates), size=min(count, len(candidates)), replace=False)}


def plan_faults(
    seed: int, server_round: int, partition_ids: list[int], drop_rate: float, straggler_rate: float
) -> tuple[set[int], set[int]]:
    """(dropped, late) of a round's k training clients: round(drop-rate * k) told to fail, and round(straggler-rate
    * k) others whose replies are set aside as if they came after the round timeout.

    A simulated straggler trains as usual (its local state moves on, as a real one's does); simulated clients
    never sleep, since a sleeping client would hold one of the simulation's few workers and delay the others.
    """
    k = len(partition_ids)
    drops = choose_faulty(seed, server_round, partition_ids, int(round(drop_rate * k)), "drop")
    late = choose_faulty(
        seed, server_round, [p for p in partition_ids if p not in drops], int(round(straggler_rate * k)), "straggler"
    )
    return drops, late
