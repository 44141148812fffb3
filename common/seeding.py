"""Deterministic seeds: one run seed, derived per purpose (partition, client, round) by a stable hash."""

from __future__ import annotations

import hashlib
import random
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where it is used: the CLI and the config read derive_seed without it
    import torch


def derive_seed(seed: int, *tags: object) -> int:
    """A 31-bit seed that depends only on `seed` and `tags` (stable across processes and machines)."""
    text = "/".join([str(seed), *map(str, tags)]).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") % (2**31 - 1)


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch globally; return a torch Generator with the same seed."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)
