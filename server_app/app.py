"""ServerApp entry: run config -> strategy by name -> rounds -> results folder."""

from __future__ import annotations

import logging
from collections.abc import Callable
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log
from threadpoolctl import threadpool_limits

from common import profiling
from common.algorithms import SPECS
from common.config import ConfigError, RunConfig, parse_run_config
from common.data.datasets import DataError
from common.data.federated import dataset_for
from common.learning.models import ModelLayout, build_model
from common.methods.robust import unprotected, walk_unbounded
from common.seeding import derive_seed
from common.storage.pages import StoreSpaceError
from common.storage.persist import StateFileError
from common.storage.run_folder import CONFIG_FILE, RunFolder
from common.storage.run_lock import ForeignLockFile, RunFolderBusy, RunLock
from common.wire.validation import is_folder_name

from .checkpoint import (
    Checkpoint,
    config_differences,
    load_checkpoint,
    new_run_id,
    read_run_id,
    server_key,
    synced_client_states,
)
from .clients import ClientRegistry, RunAborted
from .flower_private import is_simulation, speed_up_simulation
from .results import ResultsWriter, make_run_dir, read_run_config
from .results.tracking import check_installed
from .runner import RoundRunner
from .strategies import PFLStrategy, strategy_class
from .takeover import AfterTimeout, OperatorConsent

app = ServerApp()


@runtime_checkable
class KeepsClientState(Protocol):
    """A grid whose runtime keeps its clients' state in memory (the in-process engine's): before each checkpoint
    it writes what the state dirs lack (`checkpoint_round`: the last checkpoint before this one)."""

    def persist_client_state(self, checkpoint_round: int | None) -> None: ...


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
        cfg = parse_run_config(raw)
        check_installed(cfg.to_dict())  # a tracker turned on without its package: refused now, not mid-run
        return cfg
    except ConfigError as exc:
        log(ERROR, "%s", exc)
        raise RunFailed(str(exc)) from None


def _fail(message: str) -> RunFailed:
    log(ERROR, "%s", message)
    return RunFailed(message)


def _hold(run_dir: Path, resuming: bool) -> RunLock:
    """The run folder held by this server for the run's life (RunFailed naming the holder when another has it)."""
    try:
        return RunLock(run_dir).acquire()
    except (RunFolderBusy, ForeignLockFile) as exc:
        raise _fail(f"resume: {exc}" if resuming else str(exc)) from None
    except OSError as exc:
        raise _fail(f"cannot lock the run folder {run_dir}: {exc}") from None


def open_run_dir(cfg: RunConfig) -> tuple[Path, Checkpoint | None, RunLock]:
    """A new results folder, or with `resume` the given run folder and its checkpoint (checked against cfg); held
    by this server (the lock returned) until it releases it."""
    if not cfg.resume:
        if cfg.checkpoint_every > 0:  # an unusable key folder stops the run now, not after its first round
            try:
                server_key()
            except RunAborted as exc:
                raise _fail(str(exc)) from None
        run_dir = make_run_dir(cfg.resolved_results_dir, cfg.algorithm, cfg.dataset, cfg.run_name)
        lock = _hold(run_dir, resuming=False)
        try:
            new_run_id(run_dir)  # binds the checkpoints and the clients' state to this run
        except BaseException:
            lock.release()
            raise
        return run_dir, None, lock
    run_dir = Path(cfg.resume).expanduser().resolve()
    if not is_folder_name(run_dir.name):  # the folder's name keys the clients' state dirs
        raise _fail(f"resume: the run folder's name {run_dir.name!r} must be letters, digits, '.', '_' and '-'")
    if not RunFolder(run_dir).is_run():
        raise _fail(f"resume: {run_dir} is not a run folder (it has no {CONFIG_FILE})")
    lock = _hold(run_dir, resuming=True)  # before its checkpoint is read: a live server may be writing it
    try:
        return run_dir, _resumable_checkpoint(cfg, run_dir), lock
    except BaseException:
        lock.release()
        raise


def _resumable_checkpoint(cfg: RunConfig, run_dir: Path) -> Checkpoint:
    """The run folder's checkpoint, when the run config is the run's and rounds are left (RunFailed saying why not)."""
    recorded = read_run_config(run_dir)
    differ = config_differences(recorded, cfg.to_dict())
    if differ:
        details = ", ".join(f"{k} (run: {recorded.get(k)!r}, now: {cfg.to_dict().get(k)!r})" for k in differ[:5])
        raise _fail(
            f"resume: the run config differs from the run's in {details}; give the original run config "
            "plus resume=... (num-rounds may grow)"
        )
    try:
        checkpoint = load_checkpoint(run_dir)
    except StateFileError as exc:
        raise _fail(f"resume: {exc}") from None
    if checkpoint.round >= cfg.num_rounds:
        raise _fail(
            f"resume: the run already finished round {checkpoint.round} of num-rounds={cfg.num_rounds}; "
            "raise num-rounds to train on"
        )
    return checkpoint


def unprotected_deployment(cfg: RunConfig) -> str | None:
    """Why this run may not start on a SuperLink (None: it may): no key that protects its algorithm is on."""
    active = {
        key
        for key, on in (
            ("robust-aggregation", cfg.robust_aggregation != "none"),
            ("max-weight-ratio", cfg.max_weight_ratio > 0),
            ("max-update-ratio", cfg.max_update_ratio > 0),
        )
        if on
    }
    return unprotected(cfg.algorithm, SPECS[cfg.algorithm].protected_by, active, cfg.allow_unprotected)


def single_threaded_math() -> None:
    """The server's numpy and torch math on one thread. How a BLAS splits a product over threads changes its last
    bits (FedAMP's Gram matrix differed by 1e-16 between one and two threads), so one thread gives the same numbers
    on every machine, whatever its core count. It also keeps the server's BLAS from spinning against busy client
    workers: with both cores training, a two-thread float64 Gram block took 1.5-1.8 s against 0.04-0.08 s on one.
    FedAMP's big products still use every core: common/pages.map_blocks gives each thread whole blocks of its own."""
    threadpool_limits(limits=1)
    torch.set_num_threads(1)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Build the configured strategy, run it, write the results folder and name its summary last."""
    single_threaded_math()
    speed_up_simulation()  # Flower's simulation runtime, when this process runs it (server_app/flower_private.py)
    cfg = load_config(dict(context.run_config))
    simulated = is_simulation(grid)  # a SuperLink's nodes are devices: take-overs and protection are asked for
    why = None if simulated else unprotected_deployment(cfg)
    if why is not None:
        log(ERROR, "%s", why)
        raise RunFailed(why)
    if not simulated and (walk := walk_unbounded(cfg.algorithm, SPECS[cfg.algorithm].bounds_updates, cfg.lr_decay)):
        log(WARNING, "%s", walk)
    try:
        data = dataset_for(cfg.data)
        model = build_model(cfg.model, cfg.dataset, data.input_shape, data.num_classes, derive_seed(cfg.seed, "model"))
    except (DataError, ConfigError) as exc:
        log(ERROR, "%s", exc)
        raise RunFailed(str(exc)) from None
    clients = ClientRegistry(
        max_samples=cfg.max_client_samples,
        takeover_after=cfg.takeover_after,
        max_weight_ratio=cfg.max_weight_ratio,
        simulated=simulated,
        window=cfg.messages_in_flight,
    )
    try:
        strategy = strategy_class(cfg.algorithm)(cfg, ModelLayout.of(model), clients)
    except (ConfigError, ValueError) as exc:
        log(ERROR, "%s", exc)
        raise RunFailed(str(exc)) from None
    run_dir, checkpoint, lock = open_run_dir(cfg)
    try:
        run_in_folder(grid, cfg, strategy, clients, run_dir, checkpoint)
    finally:
        lock.release()  # the next server may resume the folder (an in-process engine's, in this process)


def run_in_folder(
    grid: Grid,
    cfg: RunConfig,
    strategy: PFLStrategy,
    clients: ClientRegistry,
    run_dir: Path,
    checkpoint: Checkpoint | None,
) -> None:
    """Run the rounds into the held run folder (from the checkpoint, when resuming), then write its summary."""
    simulated = is_simulation(grid)
    strategy.workdir = run_dir
    clients.consent = AfterTimeout() if cfg.takeover == "after-timeout" else OperatorConsent(run_dir)
    writer = ResultsWriter(run_dir, cfg.to_dict(), resume=checkpoint is not None)
    before_checkpoint: Callable[[int | None], None] | None = (
        grid.persist_client_state if isinstance(grid, KeepsClientState) else None
    )
    state_root = cfg.output.client_state_dir
    if simulated and state_root != "memory":
        before_checkpoint = synced_client_states(
            before_checkpoint, run_dir if state_root == "auto" else Path(state_root).expanduser()
        )
    runner = RoundRunner(
        cfg, strategy, clients, writer, run_dir.name, resume_from=checkpoint, before_checkpoint=before_checkpoint
    )
    if not simulated:  # devices keep state outside the run folder: each run's in its own folder, signed with its id
        try:  # (a simulation's clients keep theirs in the run folder; its messages stay those of every other run)
            runner.run_id = read_run_id(run_dir)
        except StateFileError as exc:
            raise _fail(f"resume: {exc}") from None
    log(INFO, "results folder: %s", run_dir)
    for method in ("send_and_receive", "push_messages", "pull_messages"):  # bench/round_profile.py only
        profiling.time_method(grid, method, "flower")
    try:
        runner.run(grid)
    except (RunAborted, StoreSpaceError) as exc:
        log(ERROR, "run aborted: %s", exc)
        raise RunFailed(str(exc)) from None
    finally:
        strategy.close()
    info = {
        "algorithm": cfg.algorithm,
        "dataset": cfg.dataset,
        "partition": cfg.partition,
        "seed": cfg.seed,
        "num_clients": len(clients),
        "shift_degrees": list(cfg.shift_degrees),
        "resumed_after_rounds": runner.resumes,
        **({"stopped_early": runner.plateau.stopped} if runner.plateau.stopped else {}),
    }
    summary_path = writer.finish(info, strategy.artifacts())
    for line in summary_path.read_text().splitlines():
        if line.strip():
            log(INFO, "%s", line)
    log(INFO, "summary: %s", summary_path)
