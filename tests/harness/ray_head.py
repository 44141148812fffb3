"""A Ray head on loopback that simulations join through RAY_ADDRESS: one cluster for many `flwr run`s."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from experiments.run.superlink import LocalSuperLink, free_port, stop_process_tree


class RayHead:
    """`ray start --head --block` on 127.0.0.1 with its own temp folder; `address` is what RAY_ADDRESS takes.
    A run that joins it skips Ray's start-up and shut-down (several seconds of a short test run). Its workers and
    drivers bind ports the OS picks: `ray start` would give them 10002, 10003, ... in turn, so two heads on one
    machine (one per xdist worker) handed two drivers port 10002 at once and one of them aborted."""

    def __init__(self, log: Path, num_cpus: int = 2) -> None:
        self.log = Path(log)
        self.num_cpus = num_cpus
        self.address = f"127.0.0.1:{free_port()}"
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        self.process: subprocess.Popen | None = None
        self.temp: Path | None = None

    def start(self, timeout: float = 180.0) -> RayHead:
        """Start the head and wait until Ray says its runtime started."""
        self.temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # Ray's socket paths must stay short
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [
                    "ray",
                    "start",
                    "--head",
                    "--block",
                    "--port",
                    self.address.split(":")[1],
                    "--node-ip-address",
                    "127.0.0.1",
                    "--num-cpus",
                    str(self.num_cpus),
                    "--min-worker-port",
                    "0",
                    "--max-worker-port",
                    "0",
                    "--ray-client-server-port",
                    str(free_port()),
                    "--include-dashboard=false",
                    "--disable-usage-stats",
                    "--temp-dir",
                    str(self.temp),
                ],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while "Ray runtime started" not in self.log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                text = self.log.read_text()[-2000:]
                self.stop()
                raise RuntimeError(f"the Ray head did not start: {text}")
            time.sleep(0.5)
        return self

    def superlink(self, home: Path) -> LocalSuperLink:
        """A private local SuperLink (not started) whose simulations join this head."""
        link = LocalSuperLink(home)
        link.env["RAY_ADDRESS"] = self.address
        return link

    def stop(self) -> None:
        """Stop the head and every process below it; remove its temp folder."""
        if self.process is not None:
            stop_process_tree(self.process)
            self.process = None
        if self.temp is not None:
            shutil.rmtree(self.temp, ignore_errors=True)
            self.temp = None

    def __enter__(self) -> RayHead:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
