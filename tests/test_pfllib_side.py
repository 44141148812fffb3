"""The PFLlib side by side's harness: the flags each algorithm's counterpart gets, the per-client results read back
into evaluations, the round-time lines, and the exported clients (PFLlib's format, this project's exact data)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from common.config import ConfigError, parse_run_config
from common.data.federated import client_data
from experiments.benchmarks.pfllib import (
    ROUND_TIME,
    SIDE,
    dataset_name,
    export_clients,
    pfllib_arguments,
    pfllib_commit,
    read_events,
    side_specs,
    side_table,
)
from experiments.studies.records import SCHEMA, record_path, write_record


def _flags(args: list[str]) -> dict[str, str]:
    return dict(zip(args[::2], args[1::2]))


def test_each_algorithm_gets_its_counterpart_and_this_projects_values() -> None:
    base = {"dataset": "fashion-mnist", "lr": 0.005, "batch-size": 10, "local-epochs": 1, "num-rounds": 25}
    names = {}
    for algorithm in SIDE:
        flags = _flags(pfllib_arguments(parse_run_config({**base, "algorithm": algorithm})))
        names[algorithm] = flags["-algo"]
        shared = (flags["-lbs"], flags["-ls"], flags["-gr"], flags["-dev"], flags["-m"])
        assert shared == ("10", "1", "25", "cpu", "CNN")
    assert names["perfedavg"] == "PerAvg" and names["fedrod"] == "FedROD" and names["pfedme"] == "pFedMe"
    assert len(set(names.values())) == len(SIDE)
    per = _flags(pfllib_arguments(parse_run_config({**base, "algorithm": "perfedavg", "perfedavg-alpha": 0.02})))
    assert (per["-lr"], per["-bt"]) == ("0.02", "0.005")  # PFLlib's -lr is the inner step, -bt the outer
    me = _flags(pfllib_arguments(parse_run_config({**base, "algorithm": "pfedme", "pfedme-k": 3, "pfedme-beta": 2.0})))
    assert (me["-K"], me["-bt"], me["-lam"], me["-lrp"], me["-lr"]) == ("3", "2.0", "15.0", "0.09", "0.005")
    dbe = _flags(pfllib_arguments(parse_run_config({**base, "algorithm": "feddbe"})))
    assert (dbe["-klw"], dbe["-mo"]) == ("50.0", "1.0")  # PFLlib's defaults (0, 0.1) would turn its MR off
    with pytest.raises(ConfigError, match="no PFLlib counterpart is mapped for dmpfl"):
        pfllib_arguments(parse_run_config({**base, "algorithm": "dmpfl"}))


def test_a_pfllib_copy_inside_another_repository_is_not_recorded_under_its_commit(tmp_path: Path) -> None:
    def git(*args: str, cwd: Path) -> str:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    outer, inner = tmp_path / "project", tmp_path / "project" / "PFLlib"
    inner.mkdir(parents=True)
    git("init", "-q", cwd=outer)
    (outer / "f").write_text("x")
    git("add", "f", cwd=outer)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "outer", cwd=outer)
    assert pfllib_commit(inner) == "unknown", "an unpacked copy inside the outer repository"
    git("init", "-q", cwd=inner)
    (inner / "main.py").write_text("")
    git("add", "main.py", cwd=inner)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "pfllib", cwd=inner)
    assert (
        pfllib_commit(inner)
        == git("rev-parse", "--short", "HEAD", cwd=inner)
        != git("rev-parse", "--short", "HEAD", cwd=outer)
    )
    assert pfllib_commit(tmp_path / "absent") == "unknown"


def test_per_client_results_become_evaluations(tmp_path: Path) -> None:
    rows = [(0, 3, 4), (1, 1, 2), (0, 4, 4), (1, 0, 2), (0, 1, 4)]  # two evaluations of two clients, one partial
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps({"id": i, "correct": c, "num": n}) + "\n" for i, c, n in rows))
    means, weighted = read_events(events, clients=2)
    assert means == [pytest.approx((0.75 + 0.5) / 2), pytest.approx(0.5)]
    assert weighted == [pytest.approx(4 / 6), pytest.approx(4 / 6)]


def test_both_round_time_lines_are_read() -> None:
    lines = ["-" * 25 + " time cost " + "-" * 25 + " 12.5", "-" * 50 + " 3.25", "Averaged Test Accuracy: 0.5"]
    assert [float(m.group(1)) for line in lines if (m := ROUND_TIME.match(line))] == [12.5, 3.25]


def test_the_study_names_the_side_by_side_runs() -> None:
    specs = side_specs(["fedavg", "fedcp"], "fmnist-fedcp,cifar-fedavg", "1")
    assert sorted(spec.name for spec in specs) == ["cifar-fedavg-seed1", "fmnist-fedcp-seed1"]
    assert len(side_specs(SIDE, None)) == 2 * len(SIDE) * 3


def test_exported_clients_are_the_runs_data_in_pfllibs_format(tmp_path: Path, data_dir: Path) -> None:
    if not (data_dir / "FashionMNIST").is_dir():
        pytest.skip(f"Fashion-MNIST is not staged in {data_dir}")
    cfg = parse_run_config(
        {"dataset": "fashion-mnist", "data-dir": str(data_dir), "partition": "dirichlet", "dirichlet-alpha": 0.1}
    )
    folder = export_clients(cfg, 3, tmp_path)
    assert folder.name == dataset_name(cfg, cfg.seed) and "MNIST" in folder.name  # PFLlib sizes its CNN by name
    for pid in range(3):
        mine = client_data(cfg.data, pid, 3)
        for part, x, y in (("train", mine.train_x, mine.train_y), ("test", mine.test_x, mine.test_y)):
            with open(folder / part / f"{pid}.npz", "rb") as handle:  # as PFLlib's read_data does
                data = np.load(handle, allow_pickle=True)["data"].tolist()
            np.testing.assert_array_equal(data["x"], x.numpy())
            np.testing.assert_array_equal(data["y"], y.numpy())


def test_the_table_reads_both_sides_records(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "runs", tmp_path / "pfllib"
    theirs.mkdir()
    for seed, accs in ((0, [0.5, 0.7, 0.6]), (1, [0.4, 0.8, 0.7])):
        name = f"fmnist-fedavg-seed{seed}"
        rounds = [
            {"round": i + 1, "wall_s": 2.0, "eval": {"num_clients": 2, "failed": 0, "mean": {"acc-shift-0": a}}}
            for i, a in enumerate(accs)
        ]
        # seed 0 made alone (others 0.05 cores on average), seed 1 beside other work (1.5 cores): its times not used
        others = (0.05 if seed == 0 else 1.5) * 60.0
        record = {"schema": SCHEMA, "name": name, "experiment": "fmnist-fedavg", "rounds": rounds}
        cpu = {"wall_s": 60.0, "run_cpu_s": 6.0 * (seed + 1), "others_cpu_s": others}
        write_record(
            record_path(ours, name),
            {**record, "config": {}, "summary": {}, "behaviour": "", "clients": 2, "machine": {"cpu": cpu}},
        )
        peer = {
            "experiment": "fmnist-fedavg",
            "rounds": 3,
            "mean_accuracy": [0.9, *accs[::-1]],
            "round_seconds": [3.0, 5.0] if seed == 0 else [30.0, 50.0],
            **({"cpu": {**cpu, "run_cpu_s": 30.0}} if seed == 1 else {}),  # seed 0 measured no CPU
        }
        (theirs / f"{name}.json").write_text(json.dumps(peer))
    row = next(line for line in side_table(ours, theirs).splitlines() if line.startswith("| fmnist | fedavg |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    # last: ours 0.6 and 0.7, PFLlib 0.5 and 0.4; best: 0.7 and 0.8 on both sides (PFLlib's round 0, 0.9, left out)
    assert [cell.split(" +/- ")[0] for cell in cells[2:6]] == ["65.00", "45.00", "75.00", "75.00"]
    # seconds a round only from runs made alone (PFLlib's: none known to be); CPU a round: 6/3 and 12/3, 30/3
    assert cells[6:] == ["2.0", "n/a", "3.0", "10.0", "2, 2"]


SCAFFOLD_CRASH = """Traceback (most recent call last):
  File "clientscaffold.py", line 73, in update_yc
    ci.data = ci - c + 1/self.num_batches/max_local_epochs/self.learning_rate * (x - yi)
ZeroDivisionError: division by zero
"""


def test_only_pfllibs_own_exception_counts_as_a_crash() -> None:
    from experiments.benchmarks.pfllib import crash_error

    assert crash_error(1, SCAFFOLD_CRASH) == "ZeroDivisionError: division by zero"
    assert crash_error(1, "Traceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: CUDA\n") == (
        "torch.OutOfMemoryError: CUDA"
    )
    assert crash_error(1, "Traceback (most recent call last):\n  ...\nStopIteration\n") == "StopIteration"
    assert crash_error(1, "Traceback (most recent call last):\n  ...\nsome words: here\n") is None
    assert crash_error(-9, SCAFFOLD_CRASH) is None  # killed: the machine's doing, worth another try
    assert crash_error(1, "Traceback (most recent call last):\n  ...\nMemoryError\n") is None
    assert crash_error(1, "Traceback (most recent call last):\n  ...\nKeyboardInterrupt\n") is None
    assert crash_error(1, "no such file\n") is None  # no traceback: not known to be PFLlib's code


def test_a_crashed_run_is_recorded_once_and_shown_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from experiments.benchmarks import pfllib as side

    calls: list[str] = []

    def crash(pfllib: Path, cfg: object, *args: object) -> None:
        calls.append(str(cfg))
        raise side.PFLlibCrash("PFLlib exited with 1", "ZeroDivisionError: division by zero")

    (tmp_path / "pfllib" / "system").mkdir(parents=True)
    (tmp_path / "pfllib" / "system" / "main.py").write_text("")
    records = tmp_path / "records"
    monkeypatch.setattr(side, "run_pfllib", crash)
    monkeypatch.setattr(side, "pfllib_records_folder", lambda: records)
    args = argparse.Namespace(
        pfllib=str(tmp_path / "pfllib"), budget_hours=1.0, algorithms="scaffold", experiments="fmnist-scaffold",
        seeds="0", rounds=0, python="python", deps="", timeout=60.0, threads=1,
    )  # fmt: skip
    committed: list[str] = []
    assert side.run_side(args, lambda path, message: committed.append(message)) == (0, 1)
    record = json.loads((records / "fmnist-scaffold-seed0.json").read_text())
    assert record["crashed"] == "ZeroDivisionError: division by zero" and record["pfllib"]["commit"] == "unknown"
    assert committed == [
        "PFLlib side by side: fmnist-scaffold-seed0 crashed in PFLlib (ZeroDivisionError: division by zero)"
    ]
    assert side.run_side(args) == (0, 0) and len(calls) == 1  # recorded: not tried again
    table = side_table(tmp_path / "ours", records)
    row = next(line for line in table.splitlines() if line.startswith("| fmnist | scaffold |"))
    assert row.endswith("| n/a | n/a | 0, 0 (+1 crashed) |")  # no accuracy, no time from a crash
    assert "- `fmnist-scaffold-seed0`: ZeroDivisionError: division by zero (PFLlib unknown)" in table


def test_round_times_replace_their_own_entry_and_only_alone_ones_reach_the_table(tmp_path: Path) -> None:
    from experiments.benchmarks.pfllib_timing import Timing, read_timings, write_timings
    from experiments.run.cpu_share import CpuShare

    alone, busy = CpuShare(100.0, 150.0, 2.0), CpuShare(100.0, 90.0, 100.0)
    ours = Timing("fmnist-fedavg", "ours", [30.0, 12.0, 14.0], alone, "abc", "a worker per core")
    theirs = Timing("fmnist-fedavg", "pfllib", [40.0, 20.0, 22.0], busy, "d832e76", "torch's")
    write_timings(tmp_path, [ours, theirs])
    assert ours.round_seconds == 13.0 and ours.alone and not theirs.alone  # the first round warms up
    again = Timing("fmnist-fedavg", "pfllib", [40.0, 24.0, 26.0], alone, "d832e76", "torch's")
    write_timings(tmp_path, [again])
    assert read_timings(tmp_path) == [ours, again]  # replaced, not added
    row = next(line for line in side_table(tmp_path / "ours", tmp_path).splitlines() if "| fmnist | fedavg |" in line)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[6:8] == ["13.0", "25.0"] and cells[-1] == "0, 0"  # the timing file is no PFLlib run record
    write_timings(tmp_path, [Timing("fmnist-fedavg", "pfllib", [40.0, 24.0], busy, "d832e76", "torch's")])
    row = next(line for line in side_table(tmp_path / "ours", tmp_path).splitlines() if "| fmnist | fedavg |" in line)
    assert [cell.strip() for cell in row.strip("|").split("|")][6:8] == ["13.0", "n/a"]


def test_a_timing_of_one_round_is_refused(tmp_path: Path) -> None:
    from experiments.benchmarks.pfllib import main

    (tmp_path / "system").mkdir()
    (tmp_path / "system" / "main.py").write_text("")
    with pytest.raises(SystemExit, match="a timing needs at least 2 rounds"):
        main(["time", "--pfllib", str(tmp_path), "--rounds", "1"])
    with pytest.raises(SystemExit, match="no experiment of the side by side matches"):
        main(["time", "--pfllib", str(tmp_path), "--experiments", "fmnist-nope"])
