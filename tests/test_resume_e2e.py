"""Kill and resume through `flwr run`: a simulation whose SuperLink is SIGKILLed mid-run, resumed from its run
folder on a new SuperLink, ends with exactly the metrics of an uninterrupted run with the same seed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from common.storage.persist import StateFileError
from server_app.checkpoint import load_checkpoint

from .conftest import REPO
from .harness.local_superlink import LocalSuperLink

pytestmark = pytest.mark.e2e
NODES = 6
# times; sizes of random ids
VARYING = ("wall_s", "elapsed_s", "aggregate_s", "evaluate_s", "bytes", "bytes_per_client")


def _config(results: Path, states: Path, extra: str = "") -> str:
    # DM-PFL: server state (w_g, m_g, versions) and client state (personal weights and masks, held global copy)
    return (
        f"algorithm='dmpfl' iterations=1 num-rounds=6 fraction-train=0.5 local-epochs=1 eval-every=2 "
        f"results-dir='{results}' run-name='run' client-state-dir='{states}' {extra}"
    )


def _records(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in VARYING} for row in rows]


def _bytes(run_dir: Path) -> list[dict]:
    return [json.loads(line)["bytes"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _checkpointed_round(run_dir: Path) -> int:
    """The round of the run's last complete checkpoint, 0 while there is none (it is written atomically)."""
    try:
        return load_checkpoint(run_dir).round
    except StateFileError:
        return 0


def test_killed_run_resumes_to_identical_metrics(tmp_path) -> None:
    with LocalSuperLink(tmp_path / "home-a") as link:
        outcome = link.run(REPO, _config(tmp_path / "a", tmp_path / "a-state"), num_supernodes=NODES)
    assert outcome.status == "finished:completed", outcome.output[-3000:]
    reference, reference_bytes = _records(tmp_path / "a" / "run"), _bytes(tmp_path / "a" / "run")
    assert len(reference) == 6
    # every client keeps state on disk and names its newest round: no honest client is refused for a missing one
    assert all(row["train"]["failed"] == 0 for row in reference), [row["train"] for row in reference]

    link = LocalSuperLink(tmp_path / "home-b").start()
    run_dir = tmp_path / "b" / "run"
    try:
        runner = link.start_run(REPO, _config(tmp_path / "b", tmp_path / "b-state"), num_supernodes=NODES)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and _checkpointed_round(run_dir) < 3:  # the metrics line comes first
            time.sleep(0.1)
        link.kill()  # the server machine dies mid-run: SuperLink, ServerApp, simulated clients at once
        runner.kill()
    finally:
        link.stop()
    stopped_after = load_checkpoint(run_dir).round
    assert 3 <= stopped_after < 6, f"the kill came too late to test anything (round {stopped_after})"
    assert not (run_dir / "summary.json").exists()

    with LocalSuperLink(tmp_path / "home-c") as link:
        outcome = link.run(
            REPO, _config(tmp_path / "b", tmp_path / "b-state", f"resume='{run_dir}'"), num_supernodes=NODES
        )
    assert outcome.status == "finished:completed", outcome.output[-3000:]
    assert f"resumed after round {stopped_after} of 6" in outcome.output
    assert _records(run_dir) == reference, "a resumed run must end with the uninterrupted run's metrics"
    # message metadata carries random run/node/message ids, so sizes may differ by a few bytes per message
    for ours, theirs in zip(_bytes(run_dir), reference_bytes):
        assert all(abs(ours[kind] - theirs[kind]) <= 16 * NODES for kind in theirs), (ours, theirs)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_after_rounds"] == [stopped_after] and summary["rounds_completed"] == 6
    assert f"resumed from its checkpoint after round(s) {stopped_after}." in (run_dir / "summary.md").read_text()


def test_resume_with_another_config_is_refused_in_one_line(tmp_path) -> None:
    with LocalSuperLink(tmp_path / "home") as link:
        first = link.run(
            REPO,
            f"num-rounds=2 fraction-train=0.5 local-epochs=1 results-dir='{tmp_path}' run-name='done'",
            num_supernodes=4,
        )
        assert first.status == "finished:completed", first.output[-3000:]
        again = link.run(
            REPO, f"num-rounds=2 fraction-train=0.5 local-epochs=1 resume='{tmp_path / 'done'}'", num_supernodes=4
        )
        other = link.run(
            REPO,
            f"num-rounds=4 lr=0.2 fraction-train=0.5 local-epochs=1 resume='{tmp_path / 'done'}'",
            num_supernodes=4,
        )
    assert again.status == "finished:failed" and "already finished round 2 of num-rounds=2" in again.output
    assert other.status == "finished:failed" and "differs from the run's in lr (run: 0.05, now: 0.2)" in other.output
    assert "Traceback" not in again.output + other.output
