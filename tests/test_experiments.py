"""The experiment CLI's pure parts: seeds and --set parsing, sweep files, resume decisions, statistics across
seeds, and the report's tables from hand-made run folders (exact numbers)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from common.hparams import ConfigError
from experiments import cli
from experiments.analysis.collect import find_runs, group_runs
from experiments.analysis.reports import write_report
from experiments.analysis.stats import fmt_ci, mean_ci, paired_difference
from experiments.cli import commands
from experiments.run.presets import PRESETS, preset, run_config_text
from experiments.run.runs import RunResult, RunSpec, parse_assignment, parse_seeds, plan, run_state
from experiments.run.sweep import load_sweep, narrow, read_sweep, run_sweep, shard, summary_line
from tests.gitrepo import one_commit_checkout

REPO = Path(__file__).resolve().parents[1]


def test_seeds_and_assignments_parse_or_fail_in_one_line() -> None:
    assert parse_seeds("0, 1,2") == [0, 1, 2]
    assert parse_seeds([3]) == [3]
    for bad in ("a", "1,1", "-1", ""):
        with pytest.raises(ConfigError, match="seeds"):
            parse_seeds(bad)
    assert parse_assignment("lr=0.1") == ("lr", 0.1)
    assert parse_assignment("num-rounds=3") == ("num-rounds", 3)
    assert parse_assignment("stages=true") == ("stages", True)
    assert parse_assignment("dataset='mnist'") == ("dataset", "mnist")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_assignment("lr")


def test_run_config_text_quotes_strings_and_refuses_quotes() -> None:
    assert run_config_text({"a": 1, "b": 0.5, "c": "x y", "d": True}) == "a=1 b=0.5 c='x y' d=true"
    with pytest.raises(ConfigError, match="single quote"):
        run_config_text({"a": "it's"})


def test_plan_checks_every_run_config_before_anything_runs() -> None:
    specs = plan("fedavg-test", preset("smoke"), {"algorithm": "fedavg", "lr": 0.1}, [0, 2])
    assert [s.name for s in specs] == ["fedavg-test-seed0", "fedavg-test-seed2"]
    assert specs[1].run_config["seed"] == 2 and specs[1].run_config["lr"] == 0.1
    assert specs[0].clients == PRESETS["smoke"].clients
    with pytest.raises(ConfigError, match="experiment bad: .*lr"):
        plan("bad", preset("smoke"), {"lr": -1}, [0])
    with pytest.raises(ConfigError, match="set by the CLI"):
        plan("x", preset("smoke"), {"seed": 3}, [0])
    with pytest.raises(ConfigError, match="preset 'gpu'"):
        preset("gpu")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_sweep_files_are_checked_with_one_line_errors(tmp_path: Path) -> None:
    name, specs = load_sweep(REPO / "bench" / "sweeps" / "smoke.toml")
    assert name == "smoke" and len(specs) == 4 and {s.seed for s in specs} == {0, 1}
    cases = {
        "nope = 1\n[[experiment]]\nname='a'\n": "unknown top-level",
        "seeds = [0]\n": "no \\[\\[experiment\\]\\]",
        "[[experiment]]\nalgorithm='fedavg'\n": "has no name",
        "[[experiment]]\nname='a'\n[[experiment]]\nname='a'\n": "two experiments",
        "[[experiment]]\nname='a'\nlr='x'\n": "experiment a: .*lr",
        "[[experiment]]\nname='a'\nclients=0\n": "clients must be",
        "[[experiment\n": "not valid TOML",
    }
    for text, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_sweep(_write(tmp_path / "s.toml", text))
    with pytest.raises(ConfigError, match="does not exist"):
        load_sweep(tmp_path / "missing.toml")


def test_shards_split_a_sweep_into_disjoint_interleaved_shares() -> None:
    specs = plan("exp", preset("smoke"), {}, list(range(7)))
    shares = [[s.seed for s in shard(specs, f"{k}/3")] for k in (1, 2, 3)]
    assert shares == [[0, 3, 6], [1, 4], [2, 5]]
    assert [s.seed for s in shard(specs, "1/1")] == list(range(7))
    for bad in ("0/2", "3/2", "1", "a/b", "1/0", "-1/2"):
        with pytest.raises(ConfigError, match="--shard .* must be K/N"):
            shard(specs, bad)


def test_the_cli_refuses_a_bad_shard_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sweep", str(REPO / "bench" / "sweeps" / "smoke.toml"), "--shard", "3/2", "--list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pflower: error: --shard '3/2' must be K/N") and len(err.strip().splitlines()) == 1


def test_only_runs_the_named_experiments_and_composes_with_shards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = "seeds = [0, 1]\n" + "".join(f"[[experiment]]\nname = '{n}'\n" for n in ("fx-a", "fx-b", "other"))
    sweep = read_sweep(_write(tmp_path / "s.toml", text))
    assert [s.name for s in narrow(sweep, "fx-*").specs] == ["fx-a-seed0", "fx-a-seed1", "fx-b-seed0", "fx-b-seed1"]
    assert [s.name for s in narrow(sweep, " other , fx-b").specs] == [
        "fx-b-seed0",
        "fx-b-seed1",
        "other-seed0",
        "other-seed1",
    ]
    for bad, message in (("fx-c", "--only: fx-c names no experiment"), (" , ", "--only needs experiment names")):
        with pytest.raises(ConfigError, match=message):
            narrow(sweep, bad)
    assert cli.main(["sweep", str(tmp_path / "s.toml"), "--only", "fx-*", "--shard", "2/2", "--list"]) == 0
    assert capsys.readouterr().out.split() == ["fx-a-seed1:", "new", "fx-b-seed1:", "new"]
    assert cli.main(["sweep", str(tmp_path / "s.toml"), "--only", "fx-b", "--only", "oth*", "--list"]) == 0
    assert capsys.readouterr().out.split()[::2] == ["fx-b-seed0:", "fx-b-seed1:", "other-seed0:", "other-seed1:"]
    assert cli.main(["sweep", str(tmp_path / "s.toml"), "--only", "FX-A", "--list"]) == 2  # names match exactly
    assert "--only: FX-A names no experiment" in capsys.readouterr().err


def test_results_run_with_only_runs_just_those_experiments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = "seeds = [0]\n" + "".join(f"[[experiment]]\nname = '{n}'\n" for n in ("fx-a", "fx-b", "other"))
    text += "[[table]]\nid = 't'\nrows = ['fx-a', 'other']\ncolumns = [{ label = '0%', metric = 'acc-shift-0' }]\n"
    ran: list[str] = []

    def execute(args: object, specs: list[RunSpec], *rest: object) -> int:
        ran.extend(s.name for s in specs)
        return 0

    monkeypatch.setattr(commands, "_execute", execute)
    sweep = _write(tmp_path / "s.toml", text)
    argv = ["results", str(sweep), "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "r.md"), "--run"]
    assert cli.main([*argv, "--only", "fx-*"]) == 2  # nothing finished: no document, in one line
    assert ran == ["fx-a-seed0", "fx-b-seed0"]
    assert cli.main([*argv, "--only", "fx-b"]) == 2  # a selection with no table row is refused before anything runs
    _write(sweep, text.split("[[table]]")[0])
    assert cli.main(argv) == 2  # so is a sweep file without tables
    assert ran == ["fx-a-seed0", "fx-b-seed0"]


def _specs(count: int) -> list[RunSpec]:
    return plan("exp", preset("smoke"), {}, list(range(count)))


def test_a_sweep_runs_what_is_not_finished_and_resumes_from_checkpoints(tmp_path: Path) -> None:
    specs = _specs(3)
    calls: list[str] = []

    def fake(spec: RunSpec) -> RunResult:
        calls.append(spec.name)
        (tmp_path / spec.name).mkdir(exist_ok=True)
        (tmp_path / spec.name / "summary.json").write_text("{}")
        return RunResult(spec, "finished", tmp_path / spec.name, 2.0)

    said: list[str] = []
    (tmp_path / "exp-seed0").mkdir()
    (tmp_path / "exp-seed0" / "summary.json").write_text("{}")  # finished earlier
    (tmp_path / "exp-seed1").mkdir()
    (tmp_path / "exp-seed1" / "checkpoint.npz").write_bytes(b"")  # killed after a round
    assert [run_state(tmp_path / s.name) for s in specs] == ["finished", "resumable", "new"]
    results = run_sweep(specs, tmp_path, fake, said.append)
    assert calls == ["exp-seed1", "exp-seed2"]
    assert "1 finished earlier (kept), 2 to run" in said[0]
    assert "[sweep 2/3] exp seed 1 (resumes from its checkpoint); ETA after this run" in said[1]
    assert "ETA 0m02s" in said[3]
    assert summary_line(results, 3) == ("sweep: all 3 runs finished", True)
    calls.clear()
    assert run_sweep(specs, tmp_path, fake, said.append) == [] and calls == []
    failed = [RunResult(specs[0], "failed", tmp_path, 1.0, None, "boom")]
    line, ok = summary_line(failed, 3)
    assert not ok and "1 of 3 runs failed: exp-seed0" in line


def test_a_finished_runs_resume_state_is_dropped_and_an_unfinished_runs_kept(tmp_path: Path) -> None:
    from experiments.run.runs import drop_resume_state

    def run_folder(name: str, finished: bool) -> Path:
        folder = tmp_path / name
        (folder / "client-state" / "partition-3").mkdir(parents=True)
        (folder / "client-state" / "partition-3" / "v1.npz").write_bytes(b"x" * 300)
        (folder / "checkpoint.npz").write_bytes(b"y" * 700)
        (folder / "metrics.jsonl").write_text("{}")
        if finished:
            (folder / "summary.json").write_text("{}")
        return folder

    done, midway = run_folder("done", True), run_folder("midway", False)
    assert drop_resume_state(done) == 1000
    assert sorted(p.name for p in done.iterdir()) == ["metrics.jsonl", "summary.json"]
    assert run_state(done) == "finished"
    assert drop_resume_state(midway) == 0 and run_state(midway) == "resumable"
    assert (midway / "client-state" / "partition-3" / "v1.npz").is_file()
    assert cli.parser().parse_args(["sweep", "x.toml", "--keep-state"]).keep_state
    assert not cli.parser().parse_args(["sweep", "x.toml"]).keep_state


def test_the_cli_reports_a_bad_key_in_one_line_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--set", "lr=-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pflower: error: experiment fedavg-digits-smoke: ") and "lr" in err
    assert len(err.strip().splitlines()) == 1
    assert cli.main(["presets"]) == 0
    assert "smoke:" in capsys.readouterr().out
    assert cli.main(["report", "/nonexistent/folder"]) == 2


def test_mean_ci_and_paired_differences_are_exact() -> None:
    mean, half, n = mean_ci([0.80, 0.82, 0.84])
    assert n == 3 and math.isclose(mean, 0.82)
    assert math.isclose(half, 4.302652729911275 * 0.02 / math.sqrt(3), rel_tol=1e-9)  # t(0.975, 2) s / sqrt(n)
    assert math.isnan(mean_ci([0.5])[1]) and mean_ci([])[2] == 0
    mean, half, n = paired_difference({0: 0.9, 1: 0.8, 2: 0.7}, {0: 0.8, 1: 0.6})
    assert n == 2 and math.isclose(mean, 0.15)
    assert math.isclose(half, 12.706204736174707 * math.sqrt(0.005) / math.sqrt(2), rel_tol=1e-9)
    assert fmt_ci(0.5, float("nan")) == "50.00" and fmt_ci(float("nan"), 0.1) == "n/a"


def _fixture_run(
    root: Path,
    name: str,
    algorithm: str,
    seed: int,
    acc: float,
    shifted: float,
    mb: float,
    flops: float,
    unseen: float | None = None,
) -> None:
    run = root / name
    run.mkdir(parents=True)
    config = {"algorithm": algorithm, "dataset": "digits", "partition": "dirichlet", "seed": seed}
    final = {
        "mean": {
            "acc-shift-0": acc,
            "acc-shift-1": shifted,
            "acc-corrupt-gaussian_noise-1": acc - 0.1,
            "acc-corrupt-gaussian_noise-3": acc - 0.3,
        },
        "std": {"acc-shift-0": 0.1, "acc-shift-1": 0.2},
        "num_clients": 4,
    }
    records = [
        {"round": 1, "eval": {"mean": {"acc-shift-0": acc + 0.05, "acc-shift-1": shifted}}},
        {"round": 2, "eval": final},
    ]
    summary = {
        "algorithm": algorithm,
        "final": final,
        "shift_degrees": [0.0, 1.0],
        "final_round": 2,
        "mb_per_client": {"train_down": mb / 2, "train_up": mb / 2},
        "train_flops_per_client": flops,
    }
    if unseen is not None:
        summary["unseen"] = {"mean": {"acc-shift-0": unseen, "finetuned-acc-shift-0": unseen + 0.2}}
    (run / "config.json").write_text(json.dumps(config))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "summary.json").write_text(json.dumps(summary))


def test_the_report_holds_exactly_the_runs_numbers(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _fixture_run(runs, "fedavg-seed0", "fedavg", 0, 0.60, 0.40, 2.0, 1e9, unseen=0.3)
    _fixture_run(runs, "fedavg-seed1", "fedavg", 1, 0.64, 0.44, 2.0, 1e9, unseen=0.5)
    _fixture_run(runs, "dmpfl-seed0", "dmpfl", 0, 0.70, 0.30, 1.0, 5e8)
    _fixture_run(runs, "dmpfl-seed1", "dmpfl", 1, 0.80, 0.34, 1.0, 5e8)
    groups = group_runs(find_runs([runs]))
    assert sorted(g.label for g in groups) == ["dmpfl", "fedavg"]
    path = write_report([runs], tmp_path / "report")
    text = path.read_text()
    half_fedavg = 12.706204736174707 * math.sqrt(0.0008) / math.sqrt(2)  # seeds 0.60, 0.64: s = 0.02 * sqrt(2)
    # best round: round 1's accuracy (5 points above the last) on both seeds
    assert f"| fedavg | fedavg | 2 | 62.00 +/- {100 * half_fedavg:.2f} | 67.00 +/- {100 * half_fedavg:.2f} |" in text
    assert "| 1.000 | 0.50x | 5.000e+08 | 0.50x |" in text  # DM-PFL's MB and FLOPs against FedAvg's
    half_diff = 12.706204736174707 * math.sqrt(0.0018) / math.sqrt(2)  # differences 0.10 and 0.16
    assert f"| dmpfl | 13.00 +/- {100 * half_diff:.2f} (n=2) |" in text
    assert "| dmpfl | -10.00 +/- 0.00 (n=2) |" not in text and "| -10.00 +/- 0.00 (n=2) |" in text
    assert "| experiment | clean | gaussian_noise | severity 1 | severity 3 |" in text
    assert "| dmpfl | 75.00 +/- 63.53 | 55.00 +/- 63.53 | 65.00 +/- 63.53 | 45.00 +/- 63.53 |" in text
    assert "| fedavg | 40.00 +/- 127.06 | 60.00 +/- 127.06 |" in text  # held-out: as received, fine-tuned
    assert "**Few seeds:** `dmpfl` (2), `fedavg` (2) ran fewer than 3 seeds" in text  # said once, under the title
    with pytest.raises(ConfigError, match="--baseline 'nope' is none of the experiments: dmpfl, fedavg"):
        write_report([runs], tmp_path / "report", "nope")
    for figure in ("accuracy_vs_shift.png", "corruptions.png", "costs.png", "frontier.png"):
        assert (tmp_path / "report" / figure).stat().st_size > 5_000
    bad = tmp_path / "bad"
    _fixture_run(bad, "x-seed0", "fedavg", 0, 0.6, 0.4, 2.0, 1e9)
    _fixture_run(bad, "x-seed1", "dmpfl", 1, 0.6, 0.4, 2.0, 1e9)
    with pytest.raises(ConfigError, match="differ"):
        group_runs(find_runs([bad]))


def test_a_key_missing_from_an_older_runs_config_counts_as_its_default(tmp_path: Path) -> None:
    _fixture_run(tmp_path, "x-seed0", "dapperfl", 0, 0.6, 0.4, 2.0, 1e9)  # written before dapperfl-variant existed
    _fixture_run(tmp_path, "x-seed1", "dapperfl", 1, 0.6, 0.4, 2.0, 1e9)
    config = tmp_path / "x-seed1" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "dapperfl-variant": "paper"}))
    assert [len(g.runs) for g in group_runs(find_runs([tmp_path]))] == [2]
    config.write_text(json.dumps({**json.loads(config.read_text()), "dapperfl-variant": "official"}))
    with pytest.raises(ConfigError, match=r"differ in \['dapperfl-variant'\]"):
        group_runs(find_runs([tmp_path]))


def test_a_failed_run_is_explained_by_its_own_error_line_not_flowers() -> None:
    from experiments.run.runs import _last_error

    output = (
        "\x1b[92mINFO \x1b[0m:      starting\n"
        "\x1b[91mERROR \x1b[0m:     mnist: expected train-images-idx3-ubyte.gz in /x/MNIST/raw\n"
        "\x1b[91mERROR \x1b[0m:     Simulation raised an exception\n"
        "\x1b[91mERROR \x1b[0m:     Exit Code: 700\n"
    )
    assert _last_error(output) == "mnist: expected train-images-idx3-ubyte.gz in /x/MNIST/raw"
    assert _last_error("ERROR : Exit Code: 700") == "Exit Code: 700"
    assert _last_error("all fine") == ""


def test_a_kept_run_made_with_other_settings_is_set_aside_unless_finished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed or interrupted run never blocks its retry (it is set aside with one line); a finished one made with
    other settings stops the sweep before anything runs, naming its folder and --replace, which sets it aside."""
    from common.config import parse_run_config
    from experiments.run.runs import changed_settings
    from experiments.run.sweep import check_kept_runs

    sweep = _write(tmp_path / "s.toml", "name = 's'\npreset = 'smoke'\n[[experiment]]\nname = 'a'\nlr = 0.1\n")
    _, specs = load_sweep(sweep)
    out = tmp_path / "out"
    kept = out / specs[0].name
    kept.mkdir(parents=True)
    saved = {**parse_run_config(specs[0].run_config).to_dict(), "data-dir": "/elsewhere", "run-name": "x"}
    (kept / "config.json").write_text(json.dumps(saved))
    assert changed_settings(specs[0], kept) == []  # where the data lives is not a setting
    (kept / "config.json").write_text(json.dumps({**saved, "lr": 0.05}))
    assert changed_settings(specs[0], kept) == ["lr: 0.05 -> 0.1"]
    assert changed_settings(specs[0], tmp_path / "nothing") == []
    (kept / "config.json").write_text(json.dumps({**saved, "lr": 0.05, "dmpfl-phases": "thirds", "iterations": 9}))
    assert changed_settings(specs[0], kept) == ["lr: 0.05 -> 0.1"], "DM-PFL's keys are no setting of a FedAvg run"
    assert cli.main(["sweep", str(sweep), "--out", str(out), "--list"]) == 0
    assert "a-seed0: incomplete (made with other settings: lr: 0.05 -> 0.1)" in capsys.readouterr().out
    said: list[str] = []
    check_kept_runs(specs, out, say=said.append)  # incomplete: out of the retry's way, nothing deleted
    (aside,) = (out / "superseded").iterdir()
    assert not kept.exists() and json.loads((aside / "config.json").read_text())["lr"] == 0.05
    assert len(said) == 1 and said[0].startswith("set aside: a-seed0 (incomplete, made with lr: 0.05 -> 0.1) -> ")
    kept.mkdir()
    (kept / "config.json").write_text(json.dumps({**saved, "lr": 0.05}))
    (kept / "summary.json").write_text("{}")  # finished
    assert cli.main(["sweep", str(sweep), "--out", str(out)]) == 2  # before any SuperLink starts
    err = capsys.readouterr().err
    assert "1 finished run(s) were made with other settings than the sweep file now asks; --replace" in err
    assert f"{kept}: lr: 0.05 -> 0.1" in err
    assert kept.is_dir(), "a refused finished run is left where it was"
    check_kept_runs(specs, out, replace=True, say=said.append)
    assert not kept.exists() and len(list((out / "superseded").iterdir())) == 2
    assert said[1].startswith("set aside: a-seed0 (finished, made with lr: 0.05 -> 0.1)")
    kept.mkdir()
    (kept / "config.json").write_text(json.dumps({**saved, "colour": "red"}))
    assert changed_settings(specs[0], kept)[0].startswith("made by another version of the code (unknown run-config")


def test_the_superlink_finds_flower_beside_the_interpreter_or_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from experiments.run.superlink import LocalSuperLink

    monkeypatch.setenv("PATH", "/nonexistent")  # an unactivated venv: its bin/ is not on PATH
    link = LocalSuperLink(tmp_path / "home")
    assert link.env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))  # no Flower beside this one
    with pytest.raises(ConfigError, match="flower-superlink is neither beside this Python nor on PATH"):
        LocalSuperLink(tmp_path / "home").start()


def test_a_sweep_counts_kept_runs_made_with_other_code(tmp_path: Path) -> None:
    from experiments.run.runs import record_code

    specs = _specs(3)
    for spec, commit in zip(specs, ("abc1234", "", "")):
        (tmp_path / spec.name).mkdir()
        record_code(tmp_path / spec.name, commit)
    app = tmp_path / "app"  # not a git checkout: its commit is '', so the run recorded under abc1234 differs
    app.mkdir()
    assert cli.other_code_runs(specs, tmp_path, app) == 1
    record_code(tmp_path / specs[0].name, "")
    assert cli.other_code_runs(specs, tmp_path, app) == 1  # '' is never recorded: the last commit stays abc1234


def test_a_run_records_its_commit_as_soon_as_its_folder_exists(tmp_path: Path) -> None:
    from experiments.run.runs import execute, run_commits

    spec = _specs(1)[0]
    seen: list[list[str]] = []

    class KilledAtTheEnd:
        """An engine whose run makes the folder, prints, then is killed before execute's own last step."""

        name = "test"

        counts_its_cpu = False

        def run(
            self, config: object, clients: object, timeout: object, echo: Callable[[str], None], *args: object
        ) -> None:
            (tmp_path / spec.name).mkdir()
            echo("[round 1/2] ...")
            seen.append(run_commits(tmp_path / spec.name))
            raise KeyboardInterrupt

    commit = one_commit_checkout(tmp_path / "app")
    with pytest.raises(KeyboardInterrupt):
        execute(KilledAtTheEnd(), tmp_path / "app", spec, tmp_path, False, lambda line: None)  # type: ignore[arg-type]
    assert seen == [[commit]]  # recorded before the kill
    assert run_commits(tmp_path / spec.name) == [commit]


def test_compare_args_spell_the_benchmarks_flags_and_default_the_data_to_the_shared_folder() -> None:
    from experiments.benchmarks.compare import REPO, SHARED_DATA, compare_args

    checkout = Path(__file__).resolve().parents[1]
    assert REPO == checkout and (REPO / "pyproject.toml").is_file(), "the engines run the app from the checkout"
    assert SHARED_DATA == checkout.parent / "shared" / "data", "../shared/data beside the checkout"
    assert compare_args(batch_size=64, lr=0.05) == [
        "--data-dir",
        str(SHARED_DATA),
        "--batch-size",
        "64",
        "--lr",
        "0.05",
    ]
    assert compare_args(data_dir="/d", eval_every=5) == ["--data-dir", "/d", "--eval-every", "5"]


@pytest.mark.parametrize(
    ("argv", "engine"),
    [(["run"], "inprocess"), (["run", "--engine", "simulation"], "simulation")],
)
def test_run_uses_the_in_process_engine_unless_told(
    argv: list[str], engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pflower run` and `pflower sweep` share one default engine; the simulation is one flag away."""
    chosen: list[tuple[str, Path]] = []

    def execute(args: object, specs: list[RunSpec], out: Path, name: str, *rest: object) -> int:
        chosen.append((name, out))
        return 0

    monkeypatch.setattr(commands, "_execute", execute)
    assert cli.main([*argv, "--out", str(tmp_path)]) == 0
    # one folder per experiment, so that `pflower report` of it never meets another experiment's runs
    assert chosen == [(engine, tmp_path.resolve() / "fedavg-digits-smoke")]


def test_keys_prints_toml_that_parses_back_to_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    """`pflower keys` is TOML (a sweep file or pyproject can take its lines) with each key's meaning as a comment."""
    import tomllib

    from common.config import known_keys, parse_run_config

    assert cli.main(["keys"]) == 0
    out = capsys.readouterr().out
    parsed = tomllib.loads(out)
    assert set(parsed) == set(known_keys())
    assert parse_run_config(parsed) == parse_run_config({})
    line = next(x for x in out.splitlines() if x.startswith("allow-download = "))
    assert line.startswith("allow-download = false  # ") and "download" in line.split("#", 1)[1]
