"""What a run had of the machine (experiments/run/cpu_share.py): its own CPU seconds, its children's once waited
for, the rest of the machine's from /proc/stat, attempts summed in the run folder and carried into the record."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from common.storage.run_folder import RunFolder
from experiments.run.cpu_share import ALONE_CORES, CpuMeter, CpuShare, machine_busy_seconds
from experiments.run.presets import preset
from experiments.run.runs import execute, plan, record_cpu
from experiments.run.superlink import RunOutcome

TICK = os.sysconf("SC_CLK_TCK")


def _stat(path: Path, user: int, nice: int, system: int, idle: int, irq: int) -> None:
    # cpu user nice system idle iowait irq softirq steal guest guest_nice, in clock ticks
    path.write_text(f"cpu  {user} {nice} {system} {idle} 7 {irq} 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")


def test_the_machines_busy_seconds_leave_idle_and_iowait_out(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    _stat(stat, 100, 20, 50, 10_000, 30)
    assert machine_busy_seconds(stat) == pytest.approx(200 / TICK)
    assert machine_busy_seconds(tmp_path / "absent") is None
    stat.write_text("not a stat file\n")
    assert machine_busy_seconds(stat) is None


def test_busy_cores_are_the_busy_seconds_over_the_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments.run import cpu_share

    stat = tmp_path / "stat"
    _stat(stat, 1000, 0, 0, 0, 0)
    monkeypatch.setattr(cpu_share.time, "sleep", lambda seconds: _stat(stat, 1000 + int(3 * TICK), 0, 0, 0, 0))
    assert cpu_share.busy_cores(2.0, stat) == pytest.approx(1.5)  # 3 CPU seconds in 2 s
    assert cpu_share.busy_cores(2.0, tmp_path / "absent") is None


def test_others_are_the_machines_busy_seconds_less_the_runs_own(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    _stat(stat, 1000, 0, 0, 0, 0)
    with CpuMeter(stat) as meter:
        _stat(stat, 1000 + 9 * TICK, 0, 0, 0, 0)  # 9 s of the machine's CPU went by meanwhile
    share = meter.share
    assert share is not None and share.others_cpu_s == pytest.approx(9.0 - share.run_cpu_s)
    with CpuMeter(stat) as meter:
        pass  # the machine's count did not move: the others used nothing (never less than nothing)
    assert meter.share is not None and meter.share.others_cpu_s == 0.0
    with CpuMeter(tmp_path / "absent") as meter:
        pass
    assert meter.share is not None and meter.share.others_cpu_s is None and not meter.share.alone


def test_a_childs_cpu_counts_as_the_runs_once_waited_for() -> None:
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    with CpuMeter() as meter:
        subprocess.run([sys.executable, "-c", burn], check=True)
    assert meter.share is not None and meter.share.run_cpu_s >= 0.3


def test_alone_means_other_work_averaged_at_most_a_tenth_of_a_core() -> None:
    assert CpuShare(100.0, 150.0, 100.0 * ALONE_CORES).alone
    assert not CpuShare(100.0, 150.0, 100.0 * ALONE_CORES + 1.0).alone
    assert CpuShare(100.0, 150.0, 80.0).others_cores == pytest.approx(0.8)
    assert CpuShare(0.0, 0.0, 0.0).others_cores is None


def test_attempts_sum_in_the_run_folder_and_a_bad_file_counts_as_none(tmp_path: Path) -> None:
    record_cpu(tmp_path, CpuShare(10.0, 15.0, 1.0))
    record_cpu(tmp_path, CpuShare(30.0, 45.0, 2.0))
    assert CpuShare.from_dict(RunFolder(tmp_path).cpu()) == CpuShare(40.0, 60.0, 3.0)
    record_cpu(tmp_path, CpuShare(5.0, 5.0, None))  # an attempt that could not see the machine
    assert CpuShare.from_dict(RunFolder(tmp_path).cpu()) == CpuShare(45.0, 65.0, None)
    (tmp_path / "cpu.json").write_text('{"wall_s": "x"}')
    assert CpuShare.from_dict(RunFolder(tmp_path).cpu()) is None
    record_cpu(tmp_path, CpuShare(1.0, 2.0, 0.0))  # starts again from the one attempt it can read
    assert CpuShare.from_dict(RunFolder(tmp_path).cpu()) == CpuShare(1.0, 2.0, 0.0)


@pytest.mark.parametrize("counts", [True, False])
def test_a_run_records_its_cpu_only_on_an_engine_whose_runs_cpu_it_can_count(tmp_path: Path, counts: bool) -> None:
    spec = plan("x", preset("smoke"), {}, [0])[0]

    class Engine:
        name = "test"
        counts_its_cpu = counts

        def run(self, config: object, clients: object, timeout: object, echo: Callable[[str], None], *a: object):
            (tmp_path / spec.name).mkdir()
            return RunOutcome(1, "", None, None)

    execute(Engine(), tmp_path / "app", spec, tmp_path, False, lambda line: None)  # type: ignore[arg-type]
    share = CpuShare.from_dict(RunFolder(tmp_path / spec.name).cpu())
    assert (share is not None) == counts


def test_a_stopped_attempt_still_adds_its_seconds_to_the_run_folder(tmp_path: Path) -> None:
    spec = plan("x", preset("smoke"), {}, [0])[0]

    class Engine:
        name = "test"
        counts_its_cpu = True

        def run(self, *args: object) -> RunOutcome:
            (tmp_path / spec.name).mkdir()  # the server made the run folder
            record_cpu(tmp_path / spec.name, CpuShare(5.0, 4.0, 0.0))  # as if an earlier attempt had run
            raise KeyboardInterrupt  # Ctrl+C or SIGTERM (the CLI raises it) while the run is under way

    with pytest.raises(KeyboardInterrupt):
        execute(Engine(), tmp_path / "app", spec, tmp_path, False, lambda line: None)  # type: ignore[arg-type]
    share = CpuShare.from_dict(RunFolder(tmp_path / spec.name).cpu())
    assert share is not None and share.wall_s > 5.0 and share.run_cpu_s >= 4.0


def test_a_documents_runs_say_how_much_of_the_machine_they_had() -> None:
    from experiments.analysis.results_doc import machine_share

    alone = CpuShare(100.0, 95.0, 5.0)  # 0.05 cores of other work
    beside = [CpuShare(100.0, 90.0, 140.0), CpuShare(300.0, 250.0, 300.0)]  # 1.4 and 1.0 cores: 440 s over 400 s
    unknown = CpuShare(100.0, 90.0, None)
    assert machine_share([alone, *beside, unknown, None]) == (
        "1 ran alone on the machine, 2 beside other work that kept 1.1 cores busy on average, "
        "2 unmeasured (runs of sweep shards side by side share the cores)"
    )
    assert machine_share([alone, alone]) == "2 ran alone on the machine"
    assert machine_share([None]) == "1 unmeasured (runs of sweep shards side by side share the cores)"
