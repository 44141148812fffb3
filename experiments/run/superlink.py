"""A private local simulation SuperLink (own ports, own FLWR_HOME, stopped by PID) for `pflower run` and tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from common.hparams import ConfigError
from experiments.run.tether import descendants, kill_all, tethered_popen


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process_tree(process: subprocess.Popen, graceful: bool = True) -> None:
    """Stop a process started with start_new_session=True, its process group and every process below it
    (also those that left the group, such as Ray workers). graceful: SIGTERM first, SIGKILL after 15 s;
    otherwise SIGKILL at once, as a crash would."""
    below = descendants(process.pid)
    if graceful:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    kill_all([process.pid, *below])
    process.wait(timeout=15)


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie, not yet reaped by its parent, has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _command_line(pid: int) -> list[str]:
    """The process's arguments from /proc ([] when it is gone or not readable)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _option(args: list[str], name: str) -> str | None:
    """The value after `name` in a command line (None when absent)."""
    return args[args.index(name) + 1] if name in args[:-1] else None


def _local_superlink_program(pid: int, log_file: Path, port: str) -> Path | None:
    """The flower-superlink program of this user's process `pid` when it is a SuperLink `flwr run` started for a
    local federation (`flower-superlink --simulation ... --port PORT --log-file FLWR_HOME/local-superlink/
    superlink.log`); None for any other process."""
    try:
        if Path(f"/proc/{pid}").stat().st_uid != os.getuid():
            return None
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None
    argv = _command_line(pid)
    # A console script runs as `python .../flower-superlink ARGS`, or directly as `flower-superlink ARGS`.
    starts = [i for i, arg in enumerate(argv[:2]) if Path(arg).name == "flower-superlink"]
    if not starts:
        return None
    args = argv[starts[0] + 1 :]
    logged = _option(args, "--log-file")
    if (
        "--simulation" in args
        and _option(args, "--port") == port
        and logged is not None
        and (cwd / logged).resolve() == log_file.resolve()
    ):
        return Path(os.path.abspath(cwd / argv[starts[0]]))
    return None


def flower_local_superlinks(home: Path, port: str, bin_dir: Path | None = None) -> tuple[list[int], list[int]]:
    """PIDs of this user's SuperLinks that `flwr run` started for the FLWR_HOME `home` on HTTP port `port`: (those
    whose flower-superlink is this environment's, beside `bin_dir`, default this Python's; those of another)."""
    log_file = home / "local-superlink" / "superlink.log"  # where Flower's managed local SuperLink logs
    ours_dir = Path(os.path.abspath(bin_dir or Path(sys.executable).parent))
    ours: list[int] = []
    others: list[int] = []
    for pid in sorted(int(entry.name) for entry in Path("/proc").glob("[0-9]*")):
        program = _local_superlink_program(pid, log_file, port) if pid != os.getpid() else None
        if program is not None:
            (ours if program.parent == ours_dir else others).append(pid)
    return ours, others


def stop_flower_local_superlink(
    home: Path | None = None, port: str | None = None, wait: float = 10.0, bin_dir: Path | None = None
) -> str:
    """Stop the SuperLink that `flwr run` of this environment (its flower-superlink beside `bin_dir`, default this
    Python's) started for a local federation (this user's; `home`: FLWR_HOME, default Flower's; `port`: its HTTP
    port, default Flower's) and the processes it started; lines saying what stopped and what was left running."""
    if home is None or port is None:
        from flwr.cli.constant import LOCAL_SUPERLINK_HTTP_API_PORT
        from flwr.supercore.utils import get_flwr_home

        home, port = home or get_flwr_home(), port or LOCAL_SUPERLINK_HTTP_API_PORT
    found, others = flower_local_superlinks(Path(home), str(port), bin_dir)
    left = (
        f"\nleft running: the local SuperLink(s) of another environment (pid {', '.join(map(str, others))}; "
        "stop one with `pflower stop-superlink` from its own environment)"
        if others
        else ""
    )
    if not found:
        where = f"FLWR_HOME {home}, port {port}"
        return f"no local SuperLink of this environment is running ({where}): nothing stopped{left}"
    below = sorted({child for pid in found for child in descendants(pid)} - set(found))
    for pid in [*found, *below]:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and any(_alive(pid) for pid in found):
        time.sleep(0.1)
    kill_all([pid for pid in [*found, *below] if _alive(pid)])
    started = f" and {len(below)} process(es) it started" if below else ""
    pids = ", ".join(map(str, found))
    return f"stopped the local SuperLink of FLWR_HOME {home} on port {port} (pid {pids}){started}{left}"


@dataclass
class RunOutcome:
    """What `flwr run` printed, the run's id and its final status as the SuperLink reports it."""

    returncode: int
    output: str
    run_id: str | None
    status: str | None


class LocalSuperLink:
    """Starts `flower-superlink --simulation` on free loopback ports, the way `flwr run` starts its own.

    `flwr run` looks for its managed local SuperLink at FLWR_LOCAL_SUPERLINK_HTTP_API_PORT; setting that
    (and the control port) to ours makes every `flwr run` in `env` use this SuperLink and no other.
    """

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self.http_port = free_port()
        self.control_port = free_port()
        self.process: subprocess.Popen | None = None
        # Flower's commands sit beside this interpreter (a venv's bin/), which need not be on PATH: `pflower`
        # called by its full path from an unactivated venv must still find them, and its Flower, not another.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.env = {
            **os.environ,
            "PATH": path,
            "FLWR_HOME": str(self.home),
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(self.http_port),
            "FLWR_LOCAL_CONTROL_API_PORT": str(self.control_port),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
        }
        if "RAY_ADDRESS" not in os.environ:  # a local Ray, not a cluster the simulation joins
            # Ray on Linux binds its processes to the machine's outward address; this setting (meant for
            # single-machine Ray on macOS and Windows) makes a local Ray use 127.0.0.1 for all of them.
            self.env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

    def start(self, timeout: float = 60.0) -> LocalSuperLink:
        """Start the SuperLink and wait until its health endpoint answers."""
        if shutil.which("flower-superlink", path=self.env["PATH"]) is None:
            raise ConfigError(
                "flower-superlink is neither beside this Python nor on PATH: install the project "
                "(pip install -e .) into the environment `pflower` runs from"
            )
        self.home.mkdir(parents=True, exist_ok=True)
        log_file = self.home / "superlink.log"
        command = [
            "flower-superlink",
            "--insecure",
            "--simulation",
            "--isolation",
            "subprocess",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.http_port),
            "--disable-runtime-dependency-installation",
            "--log-file",
            str(log_file),
        ]
        self.process = tethered_popen(command, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"flower-superlink exited with {self.process.returncode}; see {log_file}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.http_port}/health", timeout=0.5).is_success:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"flower-superlink did not become healthy in {timeout:.0f}s; see {log_file}")

    def stop(self) -> None:
        """Stop the SuperLink and everything it started (its process group, and processes that left it,
        such as a simulation's Ray workers)."""
        if self.process is None:
            return
        stop_process_tree(self.process)
        self.process = None

    def kill(self) -> None:
        """SIGKILL the SuperLink and every process below it at once, as a crash of the server machine would."""
        if self.process is None:
            return
        stop_process_tree(self.process, graceful=False)
        self.process = None

    def start_run(
        self, app_dir: Path, run_config: str, num_supernodes: int = 0, cpus_per_client: int = 1
    ) -> subprocess.Popen:
        """`flwr run APP --stream` in the background (output to FLWR_HOME/run-<n>.log); returns the process."""
        command = [
            "flwr",
            "run",
            str(app_dir),
            "--stream",
            "--run-config",
            run_config,
            *self.federation_args(num_supernodes, cpus_per_client),
        ]
        log_file = self.home / f"run-{len(list(self.home.glob('run-*.log')))}.log"
        with open(log_file, "ab") as log:
            return subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def __enter__(self) -> LocalSuperLink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(
        self,
        app_dir: Path,
        run_config: str,
        num_supernodes: int = 0,
        cpus_per_client: int = 1,
        timeout: float = 900.0,
        extra_args: Sequence[str] = (),
        ray_cpus: int = 0,
        echo: Callable[[str], None] | None = None,
        gpus_per_client: float = 0.0,
    ) -> RunOutcome:
        """`flwr run APP --stream` against this SuperLink; returns output and the run's final status. `echo` gets
        each output line as it comes (e.g. print), else the output is only collected."""
        command = [
            "flwr",
            "run",
            str(app_dir),
            "--stream",
            "--run-config",
            run_config,
            *self.federation_args(num_supernodes, cpus_per_client, ray_cpus, gpus_per_client),
            *extra_args,
        ]
        if echo is None:
            done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)
            returncode, output = done.returncode, done.stdout + done.stderr
        else:
            returncode, output = run_streamed(command, self.env, timeout, echo)
        match = re.search(r"Successfully started run (\d+)", output)
        run_id = match.group(1) if match else None
        return RunOutcome(returncode, output, run_id, self.status(run_id) if run_id else None)

    def federation_args(
        self, num_supernodes: int, cpus_per_client: int, ray_cpus: int = 0, gpus_per_client: float = 0.0
    ) -> list[str]:
        """Simulation options for `flwr run` (a deployment's SuperNodes are real processes instead); `ray_cpus` > 0
        tells Ray the machine has that many CPUs (more than the cores: several clients per core); `gpus_per_client`
        > 0 places that share of a GPU with each client."""
        extra = f" init-args-num-cpus={ray_cpus}" if ray_cpus else ""
        extra += f" client-resources-num-gpus={gpus_per_client:g}" if gpus_per_client else ""
        return [
            "--federation-config",
            f"num-supernodes={num_supernodes} client-resources-num-cpus={cpus_per_client}{extra}",
        ]

    def status(self, run_id: str, wait: float = 20.0) -> str | None:
        """'finished:completed', 'finished:failed', ... as `flwr ls` reports it (waits for a final one)."""
        deadline = time.monotonic() + wait
        status = None
        while True:
            done = subprocess.run(
                ["flwr", "ls", "--run-id", run_id, "--format", "json"],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            try:
                runs = json.loads(done.stdout).get("runs", [])
                status = runs[0]["status"] if runs else None
            except json.JSONDecodeError:
                status = None
            if (status or "").startswith("finished") or time.monotonic() > deadline:
                return status
            time.sleep(1.0)


def run_streamed(
    command: list[str], env: dict[str, str] | None, timeout: float, echo: Callable[[str], None]
) -> tuple[int, str]:
    """Run `command`, passing each output line to `echo` as it comes; (exit code, whole output). Past `timeout`
    seconds the process tree is stopped and the exit code is 124."""
    process = tethered_popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines: list[str] = []
    timer = threading.Timer(timeout, stop_process_tree, args=(process,))
    timer.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            echo(line.rstrip("\n"))
        process.wait()
    except BaseException:  # Ctrl+C or SIGTERM here: the run's own session would not hear it and run on
        stop_process_tree(process)
        raise
    finally:
        timed_out = not timer.is_alive() and process.returncode != 0
        timer.cancel()
    return (124 if timed_out else process.returncode), "".join(lines)
