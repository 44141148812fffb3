"""A simulated client drop (run-config drop-rate) is an error reply and one log line, never a traceback, on both
engines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.supercore.task_identity import TaskIdentity

from experiments.run.presets import run_config_text
from experiments.run.superlink import LocalSuperLink

REPO = Path(__file__).resolve().parents[1]
CONFIG = {
    "dataset": "digits",
    "num-rounds": 3,
    "fraction-train": 1.0,
    "local-epochs": 1,
    "seed": 1,
    "shift-degrees": "0",
    "drop-rate": 0.5,
    "eval-every": 0,
    "checkpoint-every": 0,
    "run-name": "run",
}
CLIENTS = 4
DROP_LINE = "dropped this round (simulated"


def _drop_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if DROP_LINE in line]


def _failed_in_training(run_dir: Path) -> int:
    """The training replies the server counted as failed, over all rounds (metrics.jsonl)."""
    rounds = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return sum(int(r.get("train", {}).get("failed", 0)) for r in rounds)


def test_a_dropped_client_returns_an_error_reply_instead_of_raising() -> None:
    from client_app.app import train

    class _Context:
        run_config = {"dataset": "digits", "drop-rate": 0.5}
        node_config = {"partition-id": 0, "num-partitions": 2}
        state = RecordDict()

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 2, 1
    msg = Message(
        RecordDict({"config": ConfigRecord({"server-round": 1, "simulate-drop": True})}),
        dst_node_id=2,
        message_type="train",
    )
    reply = train(msg, _Context())  # type: ignore[arg-type]
    assert reply.has_error()
    assert reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION  # the code a raising ClientApp gets
    assert "SimulatedDrop" in reply.error.reason and "client 0 dropped this round" in reply.error.reason


def test_in_process_engine_logs_one_line_per_drop(tmp_path: Path) -> None:
    config = {**CONFIG, "results-dir": str(tmp_path)}
    command = [sys.executable, "-m", "experiments.engine", "--run-config", json.dumps(config)]
    done = subprocess.run(
        [*command, "--clients", str(CLIENTS), "--workers", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    drops = _failed_in_training(tmp_path / "run")
    assert drops >= 3, "drop-rate 0.5 of 4 clients over 3 rounds drops several"
    assert len(_drop_lines(output)) == drops
    assert "Traceback" not in output


@pytest.mark.e2e
def test_simulation_engine_logs_one_line_per_drop(tmp_path: Path) -> None:
    config = {**CONFIG, "results-dir": str(tmp_path / "results")}
    with LocalSuperLink(tmp_path / "flwr-home") as link:
        outcome = link.run(REPO, run_config_text(config), num_supernodes=CLIENTS, timeout=600)
        superlink_log = (tmp_path / "flwr-home" / "superlink.log").read_text()
    assert outcome.status == "finished:completed", outcome.output[-3000:]
    output = outcome.output + superlink_log
    drops = _failed_in_training(tmp_path / "results" / "run")
    assert drops >= 3
    assert len(_drop_lines(outcome.output)) == drops
    assert "Traceback" not in output and "ClientAppException" not in output
