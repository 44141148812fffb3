"""The test files' order under xdist: longest recorded first, unrecorded at the median, pytest's order otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .harness.schedule import file_of, file_seconds, load_durations, longest_first


@dataclass
class Item:
    nodeid: str


def test_files_are_ordered_longest_first_and_unrecorded_ones_count_as_the_median() -> None:
    items = [Item(n) for n in ("t/a.py::x", "t/b.py::x", "t/c.py::x", "t/a.py::y", "t/new.py::x", "t/d.py::x")]
    durations = {"t/a.py": 1.0, "t/b.py": 50.0, "t/c.py": 10.0, "t/d.py": 2.0}  # median 6.0
    ordered = [item.nodeid for item in longest_first(items, durations)]
    assert ordered == ["t/b.py::x", "t/c.py::x", "t/new.py::x", "t/d.py::x", "t/a.py::x", "t/a.py::y"]
    assert longest_first(items, {}) == items


def test_seconds_are_summed_per_file_and_a_bad_record_is_no_order(tmp_path: Path) -> None:
    reports = [("t/a.py::x", 0.25), ("t/a.py::x", 1.0), ("t/b.py::y[1]", 2.0), ("t/a.py::z", 0.04)]
    assert file_seconds(reports) == {"t/a.py": 1.3, "t/b.py": 2.0}
    assert file_of("t/b.py::y[1::2]") == "t/b.py"
    assert load_durations(tmp_path / "missing.json") == {}
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert load_durations(tmp_path / "bad.json") == {}
    (tmp_path / "mixed.json").write_text('{"t/a.py": 3, "t/b.py": "x", "t/c.py": true, "t/d.py": 1.5}')
    assert load_durations(tmp_path / "mixed.json") == {"t/a.py": 3.0, "t/d.py": 1.5}
