"""The plateau rule of `stop-patience`: when a curve has stalled, its best round, the config's checks, and a run on
the in-process engine that stops at the round the rule names, with its checkpoint and summary saying so."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from common.config import ConfigError, parse_run_config
from common.stopping import accuracy_curve, best_round, stalled
from experiments.engine.serve import serve
from server_app.checkpoint import load_checkpoint


def test_a_young_run_never_stalls() -> None:
    # nothing is older than the window yet: no evaluation to compare with
    assert not stalled([(2, 0.5), (4, 0.5)], patience=4, min_delta=0.0)
    assert not stalled([], patience=4, min_delta=0.0)


def test_stalls_once_the_window_holds_no_rise_above_the_best_before_it() -> None:
    curve = [(2, 0.50), (4, 0.60), (6, 0.59), (8, 0.60)]
    assert stalled(curve, patience=4, min_delta=0.0)  # rounds 6, 8 never beat 0.60 (rounds <= 4)
    assert stalled(curve[:3], patience=2, min_delta=0.0)  # round 6 alone in the window, below 0.60
    assert not stalled([(2, 0.50), (4, 0.60), (6, 0.61)], patience=4, min_delta=0.0)  # round 6 beat it
    assert stalled([(2, 0.50), (4, 0.60), (6, 0.605), (8, 0.604)], patience=4, min_delta=0.01)  # by too little
    assert not stalled([(2, 0.50), (4, 0.60), (6, 0.611), (8, 0.604)], patience=4, min_delta=0.01)


def test_the_best_before_the_window_counts_not_the_last_one() -> None:
    # the best came early (round 2) and later rounds fell: the window must beat 0.7, not round 4's 0.55
    assert stalled([(2, 0.70), (4, 0.55), (6, 0.65)], patience=2, min_delta=0.0)
    assert not stalled([(2, 0.70), (4, 0.55), (6, 0.71)], patience=2, min_delta=0.0)


def test_a_nan_never_counts_as_improving_and_patience_zero_never_stops() -> None:
    assert stalled([(1, 0.5), (2, math.nan), (3, math.nan)], patience=2, min_delta=0.0)
    assert not stalled([(1, 0.5), (2, 0.5), (3, 0.5)], patience=0, min_delta=0.0)


def test_best_round_is_the_first_round_at_the_best_accuracy() -> None:
    assert best_round([(2, 0.5), (4, 0.7), (6, 0.7), (8, math.nan)]) == 4
    assert best_round([(2, math.nan)]) is None and best_round([]) is None


def test_the_curve_reads_the_evaluated_rounds_mean_accuracy_at_shift_0() -> None:
    records = [
        {"round": 1, "eval": None},
        {"round": 2, "eval": {"mean": {"acc-shift-0": 0.4, "acc-shift-1": 0.3}}},
        {"round": 3, "eval": {"mean": {"acc-shift-1": 0.3}}},
    ]
    assert accuracy_curve(records) == [(2, 0.4)]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"stop-patience": 3, "eval-every": 0}, "'eval-every' = 0 must be between 1 and it"),
        ({"stop-patience": 3, "eval-every": 5}, "'eval-every' = 5 must be between 1 and it"),
        ({"stop-patience": -1}, "stop-patience"),
        ({"stop-min-delta": 2.0}, "stop-min-delta"),
    ],
)
def test_bad_stop_settings_are_one_line_errors(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_run_config(raw)


# an lr too small to move the model: every evaluation ties with round 1, so with patience 2 the rule fires after
# round 3 (rounds 2 and 3 did not beat round 1) of a 10-round cap
STALLING = {
    "dataset": "digits",
    "algorithm": "fedavg",
    "num-rounds": 10,
    "fraction-train": 0.5,
    "local-epochs": 1,
    "lr": 1e-9,
    "eval-every": 1,
    "stop-patience": 2,
    "checkpoint-every": 5,
}


def test_a_run_that_stops_improving_stops_at_the_rule_s_round(tmp_path: Path) -> None:
    assert serve({**STALLING, "results-dir": str(tmp_path), "run-name": "run"}, 4, workers=0)
    run_dir = tmp_path / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == 3 and summary["final_round"] == 3
    assert summary["stopped_early"] == {"round": 3, "patience": 2, "min_delta": 0.0}
    assert summary["best_round"] == 1
    assert load_checkpoint(run_dir).round == 3  # the last round run is checkpointed, off the checkpoint-every grid
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3
    assert "Stopped early after round 3" in (run_dir / "summary.md").read_text()


def test_a_stopped_run_that_died_before_its_summary_resumes_to_no_more_rounds(tmp_path: Path) -> None:
    config = {**STALLING, "results-dir": str(tmp_path), "run-name": "run"}
    assert serve(config, 4, workers=0)
    run_dir = tmp_path / "run"
    first = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").unlink()  # killed after the last checkpoint, before the summary
    assert serve({**config, "resume": str(run_dir)}, 4, workers=0)
    again = json.loads((run_dir / "summary.json").read_text())
    assert again["rounds_completed"] == 3 and again["stopped_early"] == first["stopped_early"]
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3
