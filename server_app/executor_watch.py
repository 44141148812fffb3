"""`pflower-superlink` keeps its ServerApp executor alive: Flower's SuperLink (with `--isolation subprocess`) starts
one `flower-superexec` process that starts every run's ServerApp, and never looks at it again (checked with Flower
1.42.0). When that process dies (it did of one HTTP 500 on its acquire-task under load), the SuperLink goes on
accepting runs that nothing starts. Here a thread watches it: a dead executor is started again, with a short
backoff; one that dies MAX_DEATHS times within DEATH_WINDOW_S, however long each lived, ends the SuperLink with a
non-zero code, so that its supervisor (systemd's Restart=on-failure, Docker's restart policy) restarts the whole
service and the operator sees it (an executor that died every 61 s used to be restarted forever)."""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger("flwr")

DEATH_WINDOW_S = 600.0  # the window the executor's deaths are counted over (a sliding one: no count resets)
MAX_DEATHS = 5  # deaths within DEATH_WINDOW_S after which the SuperLink exits
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # wait before a restart, by the deaths in the window (the last one repeats)
EXIT_EXECUTOR_FAILED = 3  # the SuperLink's exit code when it gives up on its executor


class Process(Protocol):
    """What the watch uses of a started process (subprocess.Popen)."""

    pid: int

    def poll(self) -> int | None: ...

    def terminate(self) -> None: ...


def restart_delay(deaths_in_window: int) -> float | None:
    """Seconds to wait before starting the executor again when it has died `deaths_in_window` times within the last
    DEATH_WINDOW_S; None: give up (the SuperLink exits)."""
    if deaths_in_window >= MAX_DEATHS:
        return None
    return BACKOFF_S[min(max(deaths_in_window - 1, 0), len(BACKOFF_S) - 1)]


@dataclass
class ExecutorWatch:
    """Watches one executor process: `start` starts a new one and returns it, `give_up` ends the SuperLink."""

    start: Callable[[], Process | None]
    give_up: Callable[[int], None]
    poll_s: float = 1.0
    grace_s: float = 3.0  # a death this close before the SuperLink's stop is that stop (systemd signals both)
    clock: Callable[[], float] = time.monotonic
    restarts: int = 0
    _stopping: threading.Event = field(default_factory=threading.Event)

    def stop(self) -> None:
        """The SuperLink is shutting down: its executor's exit is expected from now on."""
        self._stopping.set()

    def watch(self, process: Process) -> None:
        """Block until stopped (or given up): start the executor again each time it exits."""
        started, deaths = self.clock(), deque[float]()
        while not self._stopping.wait(self.poll_s):
            code = process.poll()
            if code is None:
                continue
            if self._stopping.wait(self.grace_s):
                return
            now = self.clock()
            lived = now - started
            deaths.append(now)
            while deaths and deaths[0] <= now - DEATH_WINDOW_S:
                deaths.popleft()
            delay = restart_delay(len(deaths))
            if delay is None:
                log.error(
                    "the ServerApp executor (flower-superexec) exited %d times within %.0f s, the last with code %s: "
                    "no run can start; the SuperLink exits with code %d for its supervisor to restart it (see the "
                    "executor's output above)",
                    len(deaths),
                    DEATH_WINDOW_S,
                    code,
                    EXIT_EXECUTOR_FAILED,
                )
                self.give_up(EXIT_EXECUTOR_FAILED)
                return
            log.error(
                "the ServerApp executor (flower-superexec, pid %d) exited with code %s after %.0f s: no run could "
                "start; starting it again in %.0f s",
                process.pid,
                code,
                lived,
                delay,
            )
            if self._stopping.wait(delay):
                return
            replacement = self.start()
            if replacement is None:
                return
            if self._stopping.is_set():  # the SuperLink began shutting down while this one started
                replacement.terminate()
                return
            process, started = replacement, self.clock()
            self.restarts += 1
            log.info("the ServerApp executor runs again (pid %d)", process.pid)


def _exit_now(code: int) -> None:
    """End this process at once (the executor is dead; the store is SQLite, safe against an abrupt end)."""
    for handler in log.handlers + logging.getLogger().handlers:
        handler.flush()
    os._exit(code)


def install(give_up: Callable[[int], None] = _exit_now) -> None:
    """Make every SuperLink lifespan in this process watch the executor it starts (once)."""
    cli = importlib.import_module("flwr.superlink.cli.flower_superlink")
    lifespan_class = cli.SuperLinkLifespan
    if getattr(lifespan_class, "_executor_watched", False):
        return
    start_executor = lifespan_class._start_superexec_if_needed
    shutdown = lifespan_class.shutdown

    def watched_start(self: Any) -> None:
        start_executor(self)
        if self.superexec_process is None:
            return

        def start_again() -> Process | None:
            start_executor(self)
            process: subprocess.Popen[bytes] | None = self.superexec_process
            return process

        watch = ExecutorWatch(start=start_again, give_up=give_up)
        self._executor_watch = watch
        threading.Thread(target=watch.watch, args=(self.superexec_process,), name="executor-watch", daemon=True).start()

    def watched_shutdown(self: Any) -> None:
        watch = getattr(self, "_executor_watch", None)
        if watch is not None:
            watch.stop()
        shutdown(self)

    lifespan_class._start_superexec_if_needed = watched_start
    lifespan_class.shutdown = watched_shutdown
    lifespan_class._executor_watched = True
