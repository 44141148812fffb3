"""One run on the in-process engine: this process runs the ServerApp (the same `server_app.app.main` that `flwr run`
starts), a pool of worker processes runs the ClientApp for the simulated nodes.

    python -m experiments.engine --run-config '{"algorithm": "dmpfl", ...}' --clients 100 [--workers 2]

Exit status 0 when the run finished, 1 when it failed (the reason in one ERROR line), 2 for bad arguments."""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import time
from collections.abc import Sequence
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

from flwr.app import Context, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore import log

from common.config import ConfigError, parse_run_config
from common.data.arrays import DataError
from experiments.engine.grid import InProcessGrid
from experiments.run.exports import check_export, serve_export
from server_app.flower_private import set_task_identity


def available_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_workers(clients: int, threads: int) -> int:
    """One worker per core (each on `threads` threads), never more than there are clients."""
    return max(1, min(clients, available_cores() // max(1, threads)))


def serve(
    run_config: dict[str, Any], clients: int, workers: int = 0, data_export: Path | None = None, inline: bool = False
) -> bool:
    """Run the ServerApp on an in-process grid of `clients` nodes (the data set served from `data_export` when
    given; `inline`: the ClientApp answers in this process, one message at a time, with no worker to start: tests
    and profiling); True when the run finished (its summary written), False when it failed (explained in the log)."""
    from server_app.app import RunFailed
    from server_app.app import main as server_main

    try:
        cfg = parse_run_config(run_config)
        if data_export is not None:
            check_export(serve_export(data_export), cfg.data, clients, data_export)
    except (ConfigError, DataError) as exc:
        log(ERROR, "%s", exc)
        return False
    workers = 0 if inline else workers or default_workers(clients, cfg.client_threads)
    where = "inline (in this process)" if inline else f"on {workers} worker process(es)"
    log(
        INFO,
        "in-process engine: %d simulated clients %s, %d thread(s) each, device %s",
        clients,
        where,
        cfg.client_threads,
        cfg.device,
    )
    set_task_identity(1, SUPERLINK_NODE_ID, 1)  # messages need them
    context = Context(
        run_id=1, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(), run_config=dict(run_config)
    )
    # CPU as differences: a process that serves several runs (bench/throughput.py) counts each run's own
    started, cpu, children = time.monotonic(), time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    grid = InProcessGrid(run_config, clients, workers, cfg.client_threads, log_level=logging.getLogger("flwr").level)
    try:
        server_main(grid, context)
    except RunFailed:
        return False
    finally:
        grid.close()
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        workers_cpu = used.ru_utime + used.ru_stime - children.ru_utime - children.ru_stime
        log(
            INFO,
            "in-process engine: %.1f s; CPU: server %.1f s, %d workers %.1f s (their ClientApps ran %.1f s); "
            "%.1f MB of messages and replies moved",
            time.monotonic() - started,
            time.process_time() - cpu,
            workers,
            workers_cpu,
            grid.clientapp_seconds,
            grid.bytes_moved / 1e6,
        )
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, run, and give the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.engine", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run-config", required=True, help="the run config as a JSON object")
    parser.add_argument("--clients", type=int, required=True, help="simulated clients (nodes)")
    parser.add_argument("--workers", type=int, default=0, help="worker processes (default: one per core)")
    parser.add_argument(
        "--data-export", type=Path, help="serve the data set from this export (experiments/run/exports.py)"
    )
    args = parser.parse_args(argv)
    try:
        run_config = json.loads(args.run_config)
    except ValueError as exc:
        parser.error(f"--run-config is not JSON: {exc}")
    if not isinstance(run_config, dict):
        parser.error("--run-config must be a JSON object")
    if args.clients < 1 or args.workers < 0:
        parser.error("--clients must be at least 1 and --workers at least 0")
    return 0 if serve(run_config, args.clients, args.workers, args.data_export) else 1


if __name__ == "__main__":
    sys.exit(main())
