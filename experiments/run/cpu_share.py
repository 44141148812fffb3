"""How much of the machine a run had: the CPU seconds of the run itself (this process and the children it waited for)
against every CPU second the machine spent meanwhile (/proc/stat), so that a timing taken beside other work can be
told from one taken alone (a wall-clock time is void when something else ran)."""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

PROC_STAT = Path("/proc/stat")
ALONE_CORES = 0.1  # other work averaging at most this many cores over a run leaves its wall time comparable


@dataclass(frozen=True)
class CpuShare:
    """A run's wall seconds, its own CPU seconds, and the CPU seconds everything else on the machine used meanwhile
    (None where the machine does not say: no /proc/stat)."""

    wall_s: float
    run_cpu_s: float
    others_cpu_s: float | None

    @property
    def others_cores(self) -> float | None:
        """The cores other work kept busy on average during the run."""
        if self.others_cpu_s is None or self.wall_s <= 0:
            return None
        return self.others_cpu_s / self.wall_s

    @property
    def alone(self) -> bool:
        """Whether the run had the machine to itself (other work averaged at most ALONE_CORES cores)."""
        cores = self.others_cores
        return cores is not None and cores <= ALONE_CORES

    def to_dict(self) -> dict[str, float | None]:
        return {"wall_s": self.wall_s, "run_cpu_s": self.run_cpu_s, "others_cpu_s": self.others_cpu_s}

    @classmethod
    def from_dict(cls, data: object) -> CpuShare | None:
        """The share a record or run folder holds, or None when it holds none (or a malformed one)."""
        if not isinstance(data, dict):
            return None
        try:
            others = data.get("others_cpu_s")
            return cls(float(data["wall_s"]), float(data["run_cpu_s"]), None if others is None else float(others))
        except (KeyError, TypeError, ValueError):
            return None

    def __add__(self, other: CpuShare) -> CpuShare:
        """Two attempts of one run (a resumed run): their seconds summed; unknown when either's is."""
        known = self.others_cpu_s is not None and other.others_cpu_s is not None
        others = (self.others_cpu_s or 0.0) + (other.others_cpu_s or 0.0) if known else None
        return CpuShare(self.wall_s + other.wall_s, self.run_cpu_s + other.run_cpu_s, others)


def machine_busy_seconds(stat: Path = PROC_STAT) -> float | None:
    """CPU seconds every core of the machine has spent busy since boot (user, nice, system, irq, softirq, steal), or
    None without /proc/stat."""
    try:
        fields = stat.read_text().splitlines()[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    except (OSError, IndexError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of the children it has waited for (and theirs)."""
    self_usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return self_usage.ru_utime + self_usage.ru_stime + children.ru_utime + children.ru_stime


class CpuMeter:
    """`with CpuMeter() as meter: run()`, then `meter.share`: what the block used and what the rest of the machine
    used meanwhile. The block's children must have been waited for when it ends (their CPU counts only then)."""

    def __init__(self, stat: Path = PROC_STAT) -> None:
        self.stat = stat
        self.share: CpuShare | None = None

    def __enter__(self) -> CpuMeter:
        self._wall, self._own, self._busy = time.monotonic(), own_cpu_seconds(), machine_busy_seconds(self.stat)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        wall, own, busy = time.monotonic(), own_cpu_seconds(), machine_busy_seconds(self.stat)
        run_cpu = own - self._own
        others = None if busy is None or self._busy is None else max(0.0, busy - self._busy - run_cpu)
        self.share = CpuShare(wall - self._wall, run_cpu, others)


def busy_cores(seconds: float = 2.0, stat: Path = PROC_STAT) -> float | None:
    """The cores the machine kept busy over the next `seconds` (this process sleeps meanwhile), or None without
    /proc/stat: a look before a timing that must run alone."""
    before = machine_busy_seconds(stat)
    time.sleep(seconds)
    after = machine_busy_seconds(stat)
    return None if before is None or after is None else max(0.0, after - before) / seconds
