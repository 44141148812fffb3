"""The two ways the CLI runs an experiment: `inprocess` (the project's in-process engine: one server process and a
pool of client worker processes, no Flower runtime in between; the default for studies) and `simulation` (`flwr
run` on a private SuperLink with Flower's Ray-backed simulation). Both run the same ServerApp and ClientApp and
write the same run folder."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from common.hparams import ConfigError
from experiments.run.presets import ENGINES, run_config_text
from experiments.run.superlink import LocalSuperLink, RunOutcome, run_streamed

FINISHED, FAILED = "finished:completed", "finished:failed"


class Engine(Protocol):
    """Runs one experiment's run config on a simulated federation."""

    name: str
    counts_its_cpu: bool  # a run's whole CPU time is its waited-for child's (not a SuperLink's or Ray's, kept running)

    def run(
        self,
        run_config: dict[str, Any],
        clients: int,
        timeout: float,
        echo: Callable[[str], None],
        cpus_per_client: int = 1,
        gpus_per_client: float = 0.0,
    ) -> RunOutcome:
        """Run to the end (or `timeout` seconds); every output line goes to `echo`."""
        ...

    def close(self) -> None:
        """Release what the engine holds (a SuperLink)."""
        ...


def check_engine(name: str) -> str:
    """The engine's name, or ConfigError listing the engines."""
    if name not in ENGINES:
        raise ConfigError(f"engine {name!r} is not one of {', '.join(ENGINES)}")
    return name


class InProcessEngine:
    """Each run in a child process (`python -m experiments.engine`): the ServerApp there, the clients on `workers`
    worker processes (0: one per core)."""

    name = "inprocess"
    counts_its_cpu = True

    def __init__(self, workers: int = 0, data_export: Path | None = None) -> None:
        self.workers, self.data_export = workers, data_export

    def run(
        self,
        run_config: dict[str, Any],
        clients: int,
        timeout: float,
        echo: Callable[[str], None],
        cpus_per_client: int = 1,
        gpus_per_client: float = 0.0,
    ) -> RunOutcome:
        """Run it; the status is FINISHED when the child exits 0, FAILED otherwise."""
        command = [
            sys.executable,
            "-m",
            "experiments.engine",
            "--run-config",
            json.dumps(run_config),
            "--clients",
            str(clients),
            "--workers",
            str(self.workers),
            *(["--data-export", str(self.data_export)] if self.data_export else []),
        ]
        returncode, output = run_streamed(command, None, timeout, echo)
        return RunOutcome(returncode, output, None, FINISHED if returncode == 0 else FAILED)

    def close(self) -> None:
        """Nothing held between runs."""


class SimulationEngine:
    """`flwr run` against one private local SuperLink, started on first use and stopped by `close`."""

    name = "simulation"
    counts_its_cpu = False

    def __init__(self, app_dir: Path) -> None:
        self.app_dir = app_dir
        self._home: tempfile.TemporaryDirectory[str] | None = None
        self._link: LocalSuperLink | None = None

    def _started(self) -> LocalSuperLink:
        if self._link is None:
            self._home = tempfile.TemporaryDirectory(prefix="pflower-superlink-")
            self._link = LocalSuperLink(Path(self._home.name)).start()
        return self._link

    def run(
        self,
        run_config: dict[str, Any],
        clients: int,
        timeout: float,
        echo: Callable[[str], None],
        cpus_per_client: int = 1,
        gpus_per_client: float = 0.0,
    ) -> RunOutcome:
        """Submit the run with `flwr run --stream` and read its final status from the SuperLink."""
        return self._started().run(
            self.app_dir,
            run_config_text(run_config),
            clients,
            cpus_per_client,
            timeout=timeout,
            echo=echo,
            gpus_per_client=gpus_per_client,
        )

    def close(self) -> None:
        """Stop the SuperLink and everything it started."""
        if self._link is not None:
            self._link.stop()
            self._link = None
        if self._home is not None:
            self._home.cleanup()
            self._home = None


def make_engine(name: str, app_dir: Path, workers: int = 0, data_export: Path | None = None) -> Engine:
    """The named engine (`app_dir`: the Flower app the simulation runs; `workers` and `data_export`: the in-process
    engine's)."""
    if check_engine(name) == "inprocess":
        return InProcessEngine(workers, data_export)
    if data_export is not None:
        raise ConfigError("--data-export serves the in-process engine only (a simulation reads the data sets)")
    return SimulationEngine(app_dir)
