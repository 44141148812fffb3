"""Experiment tracking: every round's numbers also go to TensorBoard event files (`tensorboard/` in the run folder)
and to an MLflow tracking folder or server, when the run config turns them on, accuracies in percent as every other
place shows them; the server logs where each tracker writes. A resumed run continues the same
event files and MLflow run (its id kept in `tracking.json`) without logging a round twice; a tracker that fails
mid-run is warned about once and dropped: the run goes on."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import time
from collections.abc import Mapping
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, Protocol

from flwr.supercore import log

from common.config import RunConfig
from common.hparams import ConfigError, describe
from common.storage.persist import atomic_write_text
from common.storage.run_folder import RoundRecord, Summary

STATE_FILE = "tracking.json"
TENSORBOARD_DIR = "tensorboard"
INSTALL_HINT = "pip install 'pflower[tracking]'"
_PER_CLIENT = frozenset({"bytes_per_client", "per_client"})  # a number per client: thousands of series


def flatten_numbers(record: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """A round record's finite numbers as `a/b/c` -> value (booleans, strings, lists and per-client rows left
    out)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in _PER_CLIENT or (not prefix and key == "round"):  # the round is the step
            continue
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_numbers(value, name + "/"))
        elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(value)
    return out


_ACCURACY = re.compile(r"(^|-)acc(-|$)|^best_mean_accuracy$")  # acc-shift-0, plus-acc-shift-1, ...: fractions


def in_percent(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics with every accuracy (a fraction in the run's records) in percent, as logs and reports show it."""
    return {k: 100.0 * v if _ACCURACY.search(k.rsplit("/", 1)[-1]) else v for k, v in metrics.items()}


def round_numbers(record: Mapping[str, Any]) -> dict[str, float]:
    """What the trackers log for a round: its finite numbers (flatten_numbers), accuracies in percent."""
    return in_percent(flatten_numbers(record))


def summary_numbers(summary: Summary) -> dict[str, float]:
    """The final numbers of a run's summary: final accuracies and best accuracy (in percent), totals of bytes, FLOPs
    and time."""
    keys = ("final", "best_mean_accuracy", "rounds_completed", "bytes_total", "mb_per_client", "train_flops_total")
    fields: Mapping[str, Any] = summary
    picked = {key: fields[key] for key in (*keys, "wall_seconds") if fields.get(key) is not None}
    return in_percent(flatten_numbers(picked))


_KEYS = {info.attr: info.key for info in describe(RunConfig)}
TENSORBOARD_KEY, MLFLOW_URI_KEY = _KEYS["tensorboard"], _KEYS["mlflow_uri"]  # run-config keys, as declared


def enabled(config: Mapping[str, Any]) -> dict[str, Any]:
    """The trackers a run config turns on: {"tensorboard": True, "mlflow": uri} (absent ones left out)."""
    out: dict[str, Any] = {}
    if config.get(TENSORBOARD_KEY):
        out["tensorboard"] = True
    if config.get(MLFLOW_URI_KEY):
        out["mlflow"] = str(config[MLFLOW_URI_KEY])
    return out


def check_installed(config: Mapping[str, Any]) -> None:
    """ConfigError (one line) when a tracker is turned on but its package is not installed."""
    needs = {"tensorboard": ("tensorboard", "tensorboard=true"), "mlflow": ("mlflow", "mlflow-uri")}
    for tracker in enabled(config):
        package, key = needs[tracker]
        if importlib.util.find_spec(package) is None:
            raise ConfigError(f"run-config {key} needs the tracking extra: {INSTALL_HINT}")


def _params(config: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    """The run config as flat scalar parameters (tuples and other values as text)."""
    return {k: v if isinstance(v, str | int | float | bool) else json.dumps(v) for k, v in sorted(config.items())}


class Tracker(Protocol):
    """One tracking backend: opened at the run's start, one call per round, closed at its end."""

    name: str
    where: str  # where its logs are, as a user opens them

    def log_round(self, step: int, metrics: dict[str, float]) -> None:
        """Log one round's metrics at step = the round."""

    def close(self, final: dict[str, float], step: int) -> None:
        """Log the final summary numbers and release the backend."""


class TensorBoardTracker:
    """Scalars in RUN_DIR/tensorboard/ through torch's SummaryWriter (torch is a dependency already, and only
    the `tensorboard` package it needs is added; tensorboardX would be one more package for the same files)."""

    name = "tensorboard"

    def __init__(self, run_dir: Path, params: dict[str, Any], logged_upto: int, resumed: bool) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder = run_dir / TENSORBOARD_DIR
        # purge_step: TensorBoard drops the events of rounds after `logged_upto` a stopped run left behind
        self.writer = SummaryWriter(str(folder), purge_step=logged_upto + 1 if resumed else None)
        self.where = f"tensorboard --logdir {folder}"
        self.params = params
        if not resumed:
            self.writer.add_text("run-config", "\n".join(f"    {k} = {v}" for k, v in params.items()), 0)
            self.writer.flush()

    def log_round(self, step: int, metrics: dict[str, float]) -> None:
        """Each metric as a scalar at `step`, flushed (a crash loses nothing logged)."""
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self, final: dict[str, float], step: int) -> None:
        """The summary numbers as `summary/...` scalars and, with the run config, TensorBoard's HPARAMS view."""
        for key, value in final.items():
            self.writer.add_scalar(f"summary/{key}", value, step)
        self.writer.add_hparams(self.params, {f"hparam/{k}": v for k, v in final.items()}, run_name=".")
        self.writer.close()


def _mlflow_environment(uri: str) -> None:
    """A local folder needs MLflow's file store, which MLflow 3 only opens on request; a server that is down
    should cost seconds, not MLflow's minutes of retries (the user's own settings win)."""
    if not uri.startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def mlflow_uri(uri: str) -> str:
    """A tracking URI for MLflow: a plain (absolute) path as a `file:` URI, anything else as given."""
    return Path(uri).expanduser().as_uri() if uri.startswith(("/", "~")) else uri


class MlflowTracker:
    """Parameters once, metrics per round (step = round), summary numbers at the end, in one MLflow run."""

    name = "mlflow"

    def __init__(self, run_dir: Path, uri: str, params: dict[str, Any], run_id: str) -> None:
        _mlflow_environment(uri)
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=mlflow_uri(uri))
        if run_id:
            self.run_id = run_id
            self.client.update_run(run_id, status="RUNNING")
            self.where = f"MLflow run {run_id} at {mlflow_uri(uri)}"
            return
        experiment_name = run_dir.parent.name or "pflower"  # the results or sweep folder the run sits in
        found = self.client.get_experiment_by_name(experiment_name)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment_name)
        self.run_id = self.client.create_run(experiment_id, run_name=run_dir.name).info.run_id
        self.where = f"MLflow run {self.run_id} (experiment {experiment_name}) at {mlflow_uri(uri)}"
        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):  # MLflow takes at most 100 parameters a call
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def _log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in metrics.items()]
        for start in range(0, len(items), 1000):  # MLflow takes at most 1000 metrics a call
            self.client.log_batch(self.run_id, metrics=items[start : start + 1000])

    def log_round(self, step: int, metrics: dict[str, float]) -> None:
        """One batch of the round's metrics at step = the round."""
        self._log(metrics, step)

    def close(self, final: dict[str, float], step: int) -> None:
        """The summary numbers as `summary/...` metrics, and the run marked finished."""
        self._log({f"summary/{k}": v for k, v in final.items()}, step)
        self.client.set_terminated(self.run_id)


class RunTracking:
    """The trackers a run config turns on, fed by the ResultsWriter; remembers in RUN_DIR/tracking.json the last
    round each one logged (and the MLflow run id), so a resumed run logs every round exactly once."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        self.run_dir = run_dir
        self.config = dict(config)
        self.wanted = enabled(config)
        self.trackers: list[Tracker] = []
        self.state: dict[str, Any] = {}
        self._opened = False

    @property
    def active(self) -> bool:
        """Whether any tracker is turned on."""
        return bool(self.wanted)

    def _save(self) -> None:
        atomic_write_text(self.run_dir / STATE_FILE, json.dumps(self.state, indent=2, sort_keys=True))

    def _fail(self, tracker: Tracker, exc: Exception) -> None:
        log(WARNING, "%s tracking failed, the run goes on without it: %s", tracker.name, str(exc).splitlines()[0])
        self.trackers.remove(tracker)

    def open(self, records: list[RoundRecord], resumed: bool) -> None:
        """Start the trackers; a resumed run's state continues, and rounds of `records` not yet logged are."""
        if self._opened or not self.wanted:
            return
        self._opened = True
        check_installed(self.config)
        path = self.run_dir / STATE_FILE
        self.state = json.loads(path.read_text()) if resumed and path.is_file() else {}
        last = records[-1]["round"] if records else 0
        params = _params(self.config)
        for name in self.wanted:
            upto = min(int(self.state.get(f"{name}_last_round", 0)), last)  # later rounds are run again
            try:
                if name == "tensorboard":
                    tracker: Tracker = TensorBoardTracker(self.run_dir, params, upto, resumed)
                    self.state["tensorboard_last_round"] = upto
                else:
                    run_id = str(self.state.get("mlflow_run_id", "")) if resumed else ""
                    tracker = MlflowTracker(self.run_dir, self.wanted["mlflow"], params, run_id)
                    self.state["mlflow_run_id"] = tracker.run_id  # MLflow keeps rounds it has: they stay
                    self.state["mlflow_last_round"] = max(upto, int(self.state.get("mlflow_last_round", 0)))
            except Exception as exc:  # tracking is never worth losing a run
                log(WARNING, "%s tracking could not start, the run goes on without it: %s", name, str(exc)[:300])
                continue
            self.trackers.append(tracker)
            log(INFO, "%s tracking: %s", name, tracker.where)
        self._save()
        for record in records:
            self.add_round(record)

    def add_round(self, record: RoundRecord) -> None:
        """Log one round to every tracker that has not logged it yet."""
        if not self.trackers:
            return
        metrics = round_numbers(record)
        for tracker in list(self.trackers):
            key = f"{tracker.name}_last_round"
            if record["round"] <= int(self.state.get(key, 0)):
                continue
            try:
                tracker.log_round(record["round"], metrics)
            except Exception as exc:  # a server down mid-run: one warning, the run goes on
                self._fail(tracker, exc)
                continue
            self.state[key] = record["round"]
        self._save()

    def close(self, summary: Summary) -> None:
        """Log the final summary numbers and close every tracker."""
        final, step = summary_numbers(summary), int(summary.get("rounds_completed") or 0)
        for tracker in list(self.trackers):
            try:
                tracker.close(final, step)
            except Exception as exc:
                self._fail(tracker, exc)
        self.trackers = []
