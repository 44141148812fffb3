"""Longest test files first: with `-n auto --dist loadfile` each file runs whole on one worker, so a long file that
starts last keeps one core busy while the other idles. tests/durations.json holds each file's seconds from a full run
(`python -m pytest -n auto --dist loadfile --record-durations tests/durations.json`); files it does not name count as
its median."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol


class _Item(Protocol):
    nodeid: str


def file_of(nodeid: str) -> str:
    """The file part of a pytest node id ('tests/test_a.py::test_b[x]' -> 'tests/test_a.py')."""
    return nodeid.split("::", 1)[0]


def load_durations(path: Path) -> dict[str, float]:
    """File -> seconds from `path`; {} when it is missing or unreadable (the order then stays pytest's)."""
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {str(k): float(v) for k, v in loaded.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def longest_first(items: Sequence[_Item], durations: Mapping[str, float]) -> list[_Item]:
    """The items with whole files ordered by their recorded seconds, longest first; within a file, and among files
    of equal seconds, pytest's order is kept. A file with no record counts as the median of those with one."""
    if not durations:
        return list(items)
    unknown = statistics.median(durations.values())
    return sorted(items, key=lambda item: -durations.get(file_of(item.nodeid), unknown))


def file_seconds(reports: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Seconds per file, summed over the (node id, duration) of every setup, call and teardown, rounded to 0.1 s."""
    totals: dict[str, float] = {}
    for nodeid, seconds in reports:
        totals[file_of(nodeid)] = totals.get(file_of(nodeid), 0.0) + seconds
    return {name: round(total, 1) for name, total in sorted(totals.items())}
