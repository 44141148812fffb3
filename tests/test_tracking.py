"""Experiment tracking: TensorBoard event files and an MLflow file store read back hold exactly each round's
numbers at step = round, a resumed run logs no round twice, a missing package is one clear line, a failing tracker
does not stop the run, and a real in-process run writes one TensorBoard step per round."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from common.config import parse_run_config
from common.hparams import ConfigError
from server_app.results import ResultsWriter
from server_app.results.tracking import STATE_FILE, TENSORBOARD_DIR, check_installed, flatten_numbers

HINT = "pip install 'pflower[tracking]'"
needs_tensorboard = pytest.mark.skipif(
    importlib.util.find_spec("tensorboard") is None, reason=f"tensorboard not installed ({HINT})"
)
needs_mlflow = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason=f"mlflow not installed ({HINT})")
INFO = {"algorithm": "fedavg", "dataset": "digits", "num_clients": 4, "shift_degrees": [0.0, 1.0]}


def _record(rnd: int) -> dict[str, Any]:
    """A hand-made round record shaped like round_record's."""
    return {
        "round": rnd,
        "wall_s": 1.5 * rnd,
        "elapsed_s": 2.0 * rnd,
        "train": {"loss": 1.0 / rnd, "used": 2, "sent": 2, "flops": 1000 * rnd, "dropped": [3], "ok": True},
        "bytes": {"train_down": 100 * rnd, "train_up": 50 * rnd, "eval_down": 10, "eval_up": 1},
        "bytes_per_client": {"0": {"up": 1, "down": 2}},
        "eval": {
            "mean": {"acc-shift-0": 0.5 + 0.1 * rnd, "acc-shift-1": 0.4},
            "std": {"acc-shift-0": 0.05, "acc-shift-1": float("nan")},
            "num_clients": 4,
            "per_client": {"0": {"acc-shift-0": 0.5}},
        },
    }


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of the run's TensorBoard folder as (step, value) pairs, as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / TENSORBOARD_DIR), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_flatten_keeps_numbers_only() -> None:
    flat = flatten_numbers(_record(2))
    assert flat["train/loss"] == 0.5 and flat["bytes/train_up"] == 100.0 and flat["eval/mean/acc-shift-0"] == 0.7
    assert "round" not in flat and "train/ok" not in flat and "train/dropped" not in flat
    assert "eval/std/acc-shift-1" not in flat  # not finite
    assert not any("per_client" in key for key in flat)


def test_keys_parse_and_refuse_relative_mlflow_paths() -> None:
    assert parse_run_config({}).to_dict()["tensorboard"] is False
    assert parse_run_config({"mlflow-uri": "http://host:5000"}).to_dict()["mlflow-uri"] == "http://host:5000"
    with pytest.raises(ConfigError, match="mlflow-uri"):
        parse_run_config({"mlflow-uri": "relative/folder"})


@needs_tensorboard
def test_tensorboard_scalars_read_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = ResultsWriter(tmp_path, {"tensorboard": True, "seed": 1})
    with caplog.at_level(logging.INFO, logger="flwr"):
        for rnd in (1, 2, 3):
            writer.add_round(_record(rnd))
    assert f"tensorboard tracking: tensorboard --logdir {tmp_path / TENSORBOARD_DIR}" in caplog.text
    writer.finish(INFO)
    scalars = _scalars(tmp_path)
    assert scalars["train/loss"] == [(1, 1.0), (2, pytest.approx(0.5)), (3, pytest.approx(1 / 3))]
    # accuracies in percent, as every log line and report shows them
    assert scalars["eval/mean/acc-shift-0"] == [(1, pytest.approx(60.0)), (2, pytest.approx(70.0)), (3, 80.0)]
    assert scalars["eval/std/acc-shift-0"] == [(1, pytest.approx(5.0)), (2, pytest.approx(5.0)), (3, 5.0)]
    assert scalars["bytes/train_down"] == [(1, 100.0), (2, 200.0), (3, 300.0)]
    assert scalars["summary/best_mean_accuracy"] == [(3, pytest.approx(80.0))]
    assert json.loads((tmp_path / STATE_FILE).read_text())["tensorboard_last_round"] == 3


@needs_tensorboard
def test_tensorboard_resume_drops_rounds_after_the_checkpoint(tmp_path: Path) -> None:
    first = ResultsWriter(tmp_path, {"tensorboard": True})
    for rnd in (1, 2, 3):  # stopped after round 3, its checkpoint taken after round 2
        first.add_round(_record(rnd))
    resumed = ResultsWriter(tmp_path, {"tensorboard": True}, resume=True)
    resumed.restart_from([_record(1), _record(2)])
    rerun = {**_record(3), "wall_s": 99.0}
    resumed.add_round(rerun)
    resumed.add_round(_record(4))
    assert _scalars(tmp_path)["wall_s"] == [(1, 1.5), (2, 3.0), (3, 99.0), (4, 6.0)]


@needs_mlflow
def test_mlflow_params_and_history_read_back_and_resume(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from mlflow.tracking import MlflowClient

    uri = (tmp_path / "mlruns").as_uri()
    run_dir = tmp_path / "sweep" / "run-a"
    run_dir.mkdir(parents=True)
    config = {"mlflow-uri": uri, "lr": 0.05, "shift-degrees": [0.0, 1.0]}
    first = ResultsWriter(run_dir, config)
    with caplog.at_level(logging.INFO, logger="flwr"):
        first.add_round(_record(1))
    first.add_round(_record(2))
    run_id = json.loads((run_dir / STATE_FILE).read_text())["mlflow_run_id"]
    assert f"mlflow tracking: MLflow run {run_id} (experiment sweep) at {uri}" in caplog.text
    resumed = ResultsWriter(run_dir, config, resume=True)  # checkpoint after round 1; round 2 is run again
    resumed.restart_from([_record(1)])
    resumed.add_round(_record(2))
    resumed.add_round(_record(3))
    resumed.finish(INFO)

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == "sweep" and run.info.run_name == "run-a"
    assert run.data.params["lr"] == "0.05" and run.data.params["shift-degrees"] == "[0.0, 1.0]"
    history = client.get_metric_history(run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    assert [m.step for m in client.get_metric_history(run_id, "summary/rounds_completed")] == [3]
    accuracy = client.get_metric_history(run_id, "eval/mean/acc-shift-0")
    assert sorted((m.step, m.value) for m in accuracy) == [(1, 60.0), (2, 70.0), (3, 80.0)]  # percent
    assert run.info.status == "FINISHED"


def test_missing_package_is_one_clear_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ConfigError, match=r"tensorboard=true needs the tracking extra: pip install 'pflower\["):
        check_installed({"tensorboard": True})
    with pytest.raises(ConfigError, match="mlflow-uri needs the tracking extra"):
        check_installed({"mlflow-uri": "http://localhost:5000"})
    check_installed({"tensorboard": False, "mlflow-uri": ""})  # off: nothing needed
    from server_app.app import RunFailed, load_config

    with pytest.raises(RunFailed, match="needs the tracking extra"):
        load_config({"tensorboard": True})


@needs_mlflow
def test_a_tracker_failing_mid_run_warns_and_the_run_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = ResultsWriter(tmp_path, {"mlflow-uri": (tmp_path / "mlruns").as_uri()})
    writer.add_round(_record(1))
    tracker = writer.tracking.trackers[0]

    def down(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("tracking server down")

    tracker.log_round = down  # type: ignore[method-assign]
    writer.add_round(_record(2))
    writer.add_round(_record(3))
    writer.finish(INFO)
    warnings = [r.getMessage() for r in caplog.records if "tracking failed" in r.getMessage()]
    assert warnings == ["mlflow tracking failed, the run goes on without it: tracking server down"]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3 and (tmp_path / "summary.md").is_file()
    assert json.loads((tmp_path / STATE_FILE).read_text())["mlflow_last_round"] == 1


@needs_mlflow
def test_a_server_down_at_the_start_warns_and_the_run_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = ResultsWriter(tmp_path, {"mlflow-uri": "http://127.0.0.1:9"})  # nothing listens there
    writer.add_round(_record(1))
    writer.finish(INFO)
    assert any("mlflow tracking could not start, the run goes on" in r.getMessage() for r in caplog.records)
    assert writer.tracking.trackers == [] and (tmp_path / "summary.md").is_file()


@needs_tensorboard
def test_inprocess_run_writes_one_step_per_round(tmp_path: Path) -> None:
    from experiments.engine.serve import serve

    config = {
        "dataset": "digits",
        "num-rounds": 3,
        "fraction-train": 0.5,
        "local-epochs": 1,
        "max-samples": 400,
        "device": "cpu",
        "run-name": "run",
        "tensorboard": True,
        "results-dir": str(tmp_path),
    }
    assert serve(config, 4, workers=1)
    scalars = _scalars(tmp_path / "run")
    assert [step for step, _ in scalars["train/loss"]] == [1, 2, 3]
    assert [step for step, _ in scalars["eval/mean/acc-shift-0"]] == [1, 2, 3]
