"""ServerApp entry: run config -> strategy by name -> rounds -> results folder."""

from __future__ import annotations

import logging
from logging import ERROR, INFO
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from common.config import ConfigError, RunConfig, parse_run_config
from common.data.datasets import DataError
from common.data.federated import dataset_for
from common.masks import prunable_names
from common.models import array_specs, build_model, get_arrays
from common.seeding import derive_seed

from .results import ResultsWriter, make_run_dir
from .strategies import STRATEGIES, algorithm_config_keys
from .strategies.base import RunAborted

app = ServerApp()


class RunFailed(RuntimeError):
    """A user-facing failure (bad config, missing data, no clients); already explained in one log line."""


class _NoTracebackForRunFailed(logging.Filter):
    """Flower logs a failing ServerApp's exception with its traceback; ours was already explained in one
    line, so the traceback of a RunFailed is dropped (any other exception keeps its traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], RunFailed):
            record.exc_info = None
            record.exc_text = None
        return True


logging.getLogger("flwr").addFilter(_NoTracebackForRunFailed())


def load_config(raw: dict[str, Any]) -> RunConfig:
    """Validated run config; a bad key or value is logged as one line and aborts the run."""
    try:
        return parse_run_config(raw, algorithms=STRATEGIES, extra_keys=algorithm_config_keys())
    except ConfigError as exc:
        log(ERROR, "%s", exc)
        raise RunFailed(str(exc)) from None


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Build the configured strategy, run it, write the results folder and name its summary last."""
    cfg = load_config(dict(context.run_config))
    try:
        data = dataset_for(cfg)
        model = build_model(cfg.model, cfg.dataset, data.input_shape, data.num_classes,
                            derive_seed(cfg.seed, "model"))
    except (DataError, ConfigError) as exc:
        log(ERROR, "%s", exc)
        raise RunFailed(str(exc)) from None
    try:
        strategy = STRATEGIES[cfg.algorithm](cfg, get_arrays(model), array_specs(model), None, prunable_names(model))
    except ConfigError as exc:
        log(ERROR, "%s", exc)
        raise RunFailed(str(exc)) from None
    run_dir = make_run_dir(cfg.resolved_results_dir, cfg.algorithm, cfg.dataset, cfg.run_name)
    writer = strategy.writer = ResultsWriter(run_dir, cfg.to_dict())
    log(INFO, "results folder: %s", run_dir)
    try:
        strategy.run(grid)
    except RunAborted as exc:
        log(ERROR, "run aborted: %s", exc)
        raise RunFailed(str(exc)) from None
    info = {"algorithm": cfg.algorithm, "dataset": cfg.dataset, "partition": cfg.partition, "seed": cfg.seed,
            "num_clients": len(strategy.clients), "shift_degrees": list(cfg.shift_degrees)}
    summary_path = writer.finish(info)
    for line in summary_path.read_text().splitlines():
        if line.strip():
            log(INFO, "%s", line)
    log(INFO, "summary: %s", summary_path)
