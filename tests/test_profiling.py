"""The opt-in phase profile (bench/round_profile.py): off, the decorators hand back the very function; on, each
record is one JSON line with the phases timed inside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from common import profiling

REPO = Path(__file__).resolve().parent.parent


def test_disabled_profiling_costs_nothing() -> None:
    assert not profiling.ENABLED, "the test suite must run without PFLOWER_PROFILE"

    def work() -> int:
        return 1

    assert profiling.timed("train")(work) is work
    with profiling.record("client", kind="train") as line:
        assert line == {}


def test_enabled_profiling_writes_one_line_per_record_with_its_phases(tmp_path: Path) -> None:
    script = """
import time
from common import profiling

@profiling.timed("train")
def train():
    time.sleep(0.05)

for rnd in (1, 2):
    with profiling.record("client", kind="train", round=rnd):
        train()
        train()
train()  # outside a record: not written anywhere
"""
    env = {**os.environ, "PFLOWER_PROFILE": str(tmp_path)}
    subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, check=True, timeout=120)
    files = list(tmp_path.glob("client-*.jsonl"))
    assert len(files) == 1
    lines = [json.loads(text) for text in files[0].read_text().splitlines()]
    assert [(line["round"], line["first"]) for line in lines] == [(1, True), (2, False)]
    for line in lines:
        assert line["kind"] == "train" and set(line["phases"]) == {"train"}
        assert 0.1 <= line["phases"]["train"] <= line["end"] - line["start"]
        assert line["started_at"] <= line["imported_at"] <= line["start"]


def test_each_record_has_its_own_memory_peak_and_the_process_keeps_its_own(tmp_path: Path) -> None:
    script = """
import numpy as np
from common import profiling

with profiling.record("client", kind="train"):
    big = np.ones(300 * 2**20 // 8)  # 300 MB, touched
    del big
with profiling.record("client", kind="evaluate"):
    small = np.ones(2**20 // 8)
"""
    env = {**os.environ, "PFLOWER_PROFILE": str(tmp_path)}
    subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, check=True, timeout=120)
    train, evaluate = (json.loads(text) for text in next(tmp_path.glob("client-*.jsonl")).read_text().splitlines())
    assert train["message_peak_rss_mb"] >= 300
    assert evaluate["message_peak_rss_mb"] < train["message_peak_rss_mb"] - 250
    assert evaluate["peak_rss_mb"] == train["peak_rss_mb"] >= train["message_peak_rss_mb"]
