"""Deterministic seeds: one run seed, derived per purpose (partition, client, round) by a stable hash."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch


def derive_seed(seed: int, *tags: object) -> int:
    """A 31-bit seed that depends only on `seed` and `tags` (stable across processes and machines)."""
    text = "/".join([str(seed), *map(str, tags)]).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") % (2**31 - 1)


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch globally; return a torch Generator with the same seed."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)
