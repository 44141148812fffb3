"""Studies that outlive their machine: a run record's round trip, a behaviour change that makes records stale, a
budget that never starts a run it cannot fit, a killed budgeted sweep that leaves its finished records committed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from common.hparams import ConfigError
from common.storage.run_folder import RunFolder
from experiments.run.cpu_share import CpuShare
from experiments.run.runs import RunResult
from experiments.run.sweep import read_sweep
from experiments.studies.behaviour import behaviour_hashes, cases_of, code_digest
from experiments.studies.budgeted import budget_plan, parse_budget, run_budgeted
from experiments.studies.records import (
    CodeInfo,
    as_run,
    make_record,
    read_record,
    read_records,
    record_path,
    write_record,
)
from experiments.studies.status import RunState, StudyState, study_state
from experiments.studies.tiny import STAND_INS, tiny_config, tiny_dataset, tiny_key, tiny_per_class

from .conftest import REPO

STUDY = """
name = "study"
preset = "smoke"
seeds = [0, 1]

[[experiment]]
name = "fedavg"
algorithm = "fedavg"
hours = 0.01

[[experiment]]
name = "local"
algorithm = "local"
hours = 0.01

[[table]]
id = "t"
title = "A tiny table"
rows = ["fedavg", "local"]
baseline = "fedavg"
columns = [{ label = "0%", metric = "acc-shift-0" }]

[[document]]
out = "docs/study.md"
"""


def _study_repo(root: Path) -> Path:
    """A git repository holding one sweep file (its records and document go to its docs/)."""
    (root / "docs").mkdir(parents=True)
    (root / "bench").mkdir()
    (root / "pyproject.toml").write_text("")
    (root / "bench" / "study.toml").write_text(STUDY)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    return root / "bench" / "study.toml"


def _finished_run(run_dir: Path, seed: int = 0, algorithm: str = "fedavg") -> Path:
    """A finished run folder made by hand: its config, three rounds (two evaluated), summary, an array."""
    folder = RunFolder(run_dir)
    run_dir.mkdir(parents=True)
    folder.write_config({"algorithm": algorithm, "seed": seed, "num-rounds": 3, "data-dir": "/secret/path"})
    evaluation = {
        "num_clients": 2,
        "failed": 0,
        "mean": {"acc-shift-0": 0.5 + seed / 10},
        "std": {"acc-shift-0": 0.1},
        "per_client": {"0": {"acc-shift-0": 0.4}, "1": {"acc-shift-0": 0.6}},
    }
    for r in (1, 2, 3):
        folder.append_round(
            {
                "round": r,
                "wall_s": 1.0,
                "elapsed_s": float(r),
                "train": {"used": 2},
                "bytes": {"train_down": 10, "train_up": 10, "eval_down": 0, "eval_up": 0},
                "bytes_per_client": {"0": {"up": 5, "down": 5}},
                "eval": evaluation if r != 2 else None,
            }
        )
    summary = {"algorithm": algorithm, "seed": seed, "num_clients": 2, "wall_seconds": 12.5, "final": None}
    folder.write_summary(summary, "# summary\n")  # type: ignore[arg-type]
    folder.write_artifacts({"attention": np.arange(6, dtype=np.float32).reshape(2, 3), "big": np.zeros(30_000)})
    return run_dir


def test_a_record_reads_back_as_the_run_it_came_from(tmp_path: Path) -> None:
    run_dir = _finished_run(tmp_path / "runs" / "fedavg-seed1", seed=1)
    record = make_record(run_dir, "study", "fedavg", 2, CodeInfo(["abc1234"], "0123456789abcdef"), "data42")
    path = write_record(record_path(tmp_path / "records", "fedavg-seed1"), record)
    first = path.read_bytes()
    write_record(path, record)
    assert path.read_bytes() == first  # the same record, the same bytes (no timestamp in the gzip header)
    back = read_record(path)
    assert back == json.loads(json.dumps(record))
    assert back["config"] == {"algorithm": "fedavg", "seed": 1, "num-rounds": 3}  # the machine's path left out
    assert back["behaviour"] == "0123456789abcdef" and back["code"] == {"commits": ["abc1234"], "dirty": False}
    assert back["data"] == {"name": None, "fingerprint": "data42"} and back["wall_seconds"] == 12.5
    rounds = back["rounds"]
    assert [r["round"] for r in rounds] == [1, 2, 3] and all("bytes_per_client" not in r for r in rounds)
    assert "per_client" not in rounds[0]["eval"] and rounds[2]["eval"]["per_client"]["1"] == {"acc-shift-0": 0.6}
    run = as_run(back, tmp_path / "records")
    assert run.path.name == "fedavg-seed1" and run.seed == 1 and run.summary["wall_seconds"] == 12.5
    assert set(run.artifacts()) == {"attention"}  # a 30,000-element array is not kept
    np.testing.assert_array_equal(run.artifacts()["attention"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert run.commits == ["abc1234"] and run.best_round() == {"acc-shift-0": 0.6}
    assert read_records(tmp_path / "records")["fedavg-seed1"] == back
    assert "cpu" not in back["machine"], "a run made outside a sweep measured no CPU share"
    RunFolder(run_dir).write_cpu({"wall_s": 10.0, "run_cpu_s": 18.0, "others_cpu_s": 0.5})
    made = make_record(run_dir, "study", "fedavg", 2, CodeInfo(["abc1234"], "0123456789abcdef"), "data42")
    assert made["machine"]["cpu"] == {"wall_s": 10.0, "run_cpu_s": 18.0, "others_cpu_s": 0.5}
    assert run.cpu is None and as_run(made, tmp_path).cpu == CpuShare(10.0, 18.0, 0.5)


def test_a_record_of_another_schema_or_an_unfinished_run_is_refused(tmp_path: Path) -> None:
    run_dir = _finished_run(tmp_path / "run")
    record = make_record(run_dir, "s", "e", 2, CodeInfo([], "x"), "d")
    path = write_record(tmp_path / "r.json.gz", {**record, "schema": 99})
    with pytest.raises(ConfigError, match="schema 99, this code reads schema 1"):
        read_record(path)
    (tmp_path / "junk.json.gz").write_bytes(b"not gzip")
    with pytest.raises(ConfigError, match="not a readable run record"):
        read_record(tmp_path / "junk.json.gz")
    RunFolder(run_dir).summary_path.unlink()
    with pytest.raises(ConfigError, match="has not finished"):
        make_record(run_dir, "s", "e", 2, CodeInfo([], "x"), "d")


def test_the_tiny_run_ignores_seed_and_size_keys_and_fills_in_defaults() -> None:
    partial = {"algorithm": "fedavg", "seed": 3, "num-rounds": 300, "lr": 0.1}
    full = {**tiny_config({"algorithm": "fedavg", "lr": 0.1}, 100)[0], "seed": 7, "results-dir": "/x"}
    assert tiny_key(partial, 100) == tiny_key(full, 100) == tiny_key({**partial, "max-samples": 50}, 10)
    assert tiny_key(partial, 100) != tiny_key({**partial, "lr": 0.2}, 100)
    assert tiny_key(partial, 100) != tiny_key(partial, 3)  # fewer clients than the tiny run's six is another run
    config, clients = tiny_config(partial, 100)
    assert clients == 6 and config["num-rounds"] == 4 and config["device"] == "cpu" and "results-dir" not in config
    assert config["shift-degrees"] == "0,0.2,0.4,0.6,0.8,1"  # as a run config holds it, not a list


@pytest.mark.parametrize("name", sorted(STAND_INS))
def test_each_tiny_stand_in_is_shaped_as_its_data_set(name: str, data_dir: Path) -> None:
    from common.data.datasets import check_dataset_files, load_dataset

    try:
        check_dataset_files(name, str(data_dir))
    except Exception as exc:  # the data set is not staged here
        pytest.skip(f"{name} is not staged under {data_dir}: {exc}")
    real, tiny = load_dataset(name, str(data_dir)), tiny_dataset(name)
    assert tiny.input_shape == real.input_shape and tiny.x.dtype == real.x.dtype
    assert tiny.num_classes == real.num_classes and tiny.scale == real.scale
    assert tiny.domain_names == real.domain_names and tiny.natural_kind == real.natural_kind
    assert (tiny.domain is None) == (real.domain is None) and (tiny.natural_id is None) == (real.natural_id is None)
    np.testing.assert_array_equal(tiny.x, tiny_dataset(name).x)  # seeded: the same every time


def test_fedamps_exact_split_has_a_behaviour_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # grouped-exact never scales its sizes down: the stand-in must hold what six clients of it take
    monkeypatch.setenv("PFL_CACHE_DIR", str(tmp_path / "cache"))
    config = {"algorithm": "fedavg", "dataset": "mnist", "partition": "grouped-exact", "model": "mlp"}
    hashes = behaviour_hashes(cases_of([(config, 100)]))
    assert len(hashes) == 1 and not next(iter(hashes.values())).startswith("failed"), hashes
    assert tiny_per_class(config) > tiny_per_class({**config, "partition": "grouped"})


@pytest.mark.parametrize(
    "private",
    [
        {"dp": "central", "fraction-train": 0.5},
        # SecAgg+'s keys, shares and masks are drawn from the operating system in every run: its record is not in a
        # message's digest (before, each hashing of this config gave another hash)
        {"dp": "distributed", "secagg": "secaggplus", "fraction-train": 1.0},
    ],
)
def test_a_differentially_private_config_has_one_behaviour_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private: dict
) -> None:
    # the run's noise and sample come from a secret drawn at its start; the tiny run must fix them, or a DP record
    # could never be current
    config = {"algorithm": "fedavg", "model": "mlp", "dp-noise-multiplier": 1.0, **private}
    assert tiny_config({**config, "dp-noise-seed": 0}, 100)[0]["dp-noise-seed"] != 0
    hashes = []
    for attempt in range(2):
        monkeypatch.setenv("PFL_CACHE_DIR", str(tmp_path / f"cache-{attempt}"))
        hashes.append(behaviour_hashes(cases_of([(config, 100)])))
    assert hashes[0] == hashes[1] and not next(iter(hashes[0].values())).startswith("failed"), hashes


def test_the_tiny_run_of_a_sampled_secure_aggregation_config_aggregates(tmp_path: Path) -> None:
    # 10% of 1,000 clients a round is 100; of the tiny run's 6 it would be under the 3 SecAgg+ needs, every round's
    # model kept and nothing of the training pinned by the hash
    from experiments.engine.serve import serve

    config = {"algorithm": "fedavg", "dataset": "digits", "secagg": "secaggplus", "fraction-train": 0.1}
    tiny, clients = tiny_config(config, 1000)
    assert tiny["fraction-train"] == 0.5 and tiny_config({**config, "secagg": "none"}, 1000)[0]["fraction-train"] == 0.1
    assert serve({**tiny, "results-dir": str(tmp_path), "run-name": "run"}, clients, inline=True)
    rounds = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["train"]["secagg"].get("survivors") for r in rounds] == [3] * len(rounds), rounds[0]["train"]


def _copy_code(to: Path) -> Path:
    for part in ("common", "server_app", "client_app", "experiments"):
        shutil.copytree(REPO / part, to / part, ignore=shutil.ignore_patterns("__pycache__"))
    return to


def test_changing_one_algorithms_update_rule_makes_its_records_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PFL_CACHE_DIR", str(tmp_path / "cache"))
    sweep_file = tmp_path / "study.toml"
    sweep_file.write_text(STUDY)
    sweep = read_sweep(sweep_file)
    records = tmp_path / "records"
    code = _copy_code(tmp_path / "code")
    today = behaviour_hashes(cases_of([(s.run_config, s.clients) for s in sweep.specs]), code)
    assert len(today) == 2 and not any(h.startswith("failed") for h in today.values())
    for spec in sweep.specs:  # records made by the code as it is
        run_dir = _finished_run(tmp_path / "runs" / spec.name, spec.seed, spec.run_config["algorithm"])
        RunFolder(run_dir).write_config({**spec.run_config})
        behaviour = today[tiny_key(spec.run_config, spec.clients)]
        record = make_record(run_dir, "study", spec.experiment, spec.clients, CodeInfo(["c"], behaviour), "d")
        write_record(record_path(records, spec.name), record)

    def hasher(cases: dict) -> dict[str, str]:
        return behaviour_hashes(cases, code)

    before = study_state(sweep_file, sweep, hasher, records)
    assert [r.state for r in before.runs] == ["current"] * 4
    # FedAvg's clients now add a proximal term: its update rule changes, Local's does not
    fedavg = code / "client_app" / "algorithms" / "fedavg.py"
    text = fedavg.read_text()
    rule = '        """Additional loss terms (none for FedAvg)."""\n        return []'
    assert rule in text
    changed = '        """Now a proximal term."""\n        return [proximal_loss(dict(model.named_parameters()), 0.5)]'
    fedavg.write_text(text.replace(rule, changed))
    assert code_digest(code) != code_digest(REPO)
    after = study_state(sweep_file, sweep, hasher, records)
    assert {r.spec.name: r.state for r in after.runs} == {
        "fedavg-seed0": "stale",
        "fedavg-seed1": "stale",
        "local-seed0": "current",
        "local-seed1": "current",
    }
    assert "behaviour" in after.runs[0].why


def _state(name: str, hours: float, seed: int = 0) -> RunState:
    from experiments.run.presets import preset
    from experiments.run.runs import RunSpec

    spec = RunSpec(f"{name}-seed{seed}", name, seed, {"algorithm": "fedavg"}, 6, preset("smoke"))
    return RunState(spec, "missing", "no record", hours)


def test_a_budget_never_starts_a_run_its_estimate_does_not_fit() -> None:
    from experiments.run.sweep import Sweep

    runs = [_state("long", 2.0), _state("short", 0.25), _state("gpu", 5.0), _state("second", 0.5, seed=1)]
    study = StudyState(Path("s.toml"), Sweep("s", [r.spec for r in runs], []), Path("records"), runs)
    now = [0.0]
    started: list[str] = []
    landed: list[str] = []

    def run_one(study: StudyState, run: RunState) -> RunResult:
        started.append(run.spec.name)
        now[0] += run.hours * 3600  # each run takes its estimate
        return RunResult(run.spec, "finished", Path(run.spec.name), run.hours * 3600)

    def land(study: StudyState, run: RunState, result: RunResult) -> None:
        landed.append(run.spec.name)

    outcome = run_budgeted([study], parse_budget("1h"), run_one, land, lambda line: None, lambda: now[0])
    # seed 0 first: long (2 h) cannot fit in 1 h, short (15 min) runs, gpu (5 h) is listed, then seed 1's 30 min
    assert started == landed == ["short-seed0", "second-seed1"]
    assert outcome.not_fitted == ["s/long-seed0"] and outcome.gpu == ["s/gpu-seed0"]
    now[0] = 0.0
    started.clear()
    run_budgeted([study], parse_budget("20m"), run_one, land, lambda line: None, lambda: now[0])
    assert started == ["short-seed0"]  # 5 minutes left after it: the 30-minute run does not start


def test_a_budget_listing_plans_the_same_runs_and_starts_none() -> None:
    from experiments.run.sweep import Sweep

    runs = [_state("long", 2.0), _state("short", 0.25), _state("gpu", 5.0), _state("second", 0.5, seed=1)]
    study = StudyState(Path("s.toml"), Sweep("s", [r.spec for r in runs], []), Path("records"), runs)
    lines = budget_plan([study], parse_budget("1h"))
    assert lines[1:-1] == [
        "  s/long-seed0: ~120 min, does not fit in the ~60 min left",
        "  s/short-seed0: would run (missing, ~15 min)",
        "  s/gpu-seed0: needs a GPU (~5.0 h here): not started",
        "  s/second-seed1: would run (missing, ~30 min)",
    ]
    assert lines[-1] == "budget: ~45 min of runs would start (estimates; nothing was run)"
    assert "does not fit in the ~5 min left" in budget_plan([study], parse_budget("20m"))[-2]


def test_sweep_budget_list_runs_nothing(tmp_path: Path) -> None:
    sweep_file = _study_repo(tmp_path / "repo")
    repo = sweep_file.parent.parent
    env = {**os.environ, "PYTHONPATH": str(REPO), "PFL_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "experiments.cli", "sweep", str(sweep_file), "--budget", "1h", "--list"]
    listed = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr
    assert "  study/fedavg-seed0: would run (missing" in listed.stdout and "nothing was run" in listed.stdout
    assert not (repo / "results").exists() and len(_log(repo)) == 1
    refused = subprocess.run([*command, "--commit"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "--list runs nothing, so it has nothing to --commit" in refused.stderr


@pytest.mark.parametrize(("text", "seconds"), [("2h30m", 9000.0), ("90m", 5400.0), ("1.5h", 5400.0), ("45s", 45.0)])
def test_budgets_parse(text: str, seconds: float) -> None:
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("text", ["", "2x", "h", "0m", "2h 30"])
def test_a_bad_budget_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--budget"):
        parse_budget(text)


def _log(repo: Path) -> list[str]:
    done = subprocess.run(["git", "-C", str(repo), "log", "--format=%s"], capture_output=True, text=True)
    return done.stdout.splitlines()


def test_a_killed_budgeted_sweep_leaves_every_finished_record_committed(tmp_path: Path) -> None:
    sweep_file = _study_repo(tmp_path / "repo")
    repo = sweep_file.parent.parent
    env = {
        **os.environ,
        "PFL_CACHE_DIR": str(tmp_path / "cache"),
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    command = [sys.executable, "-m", "experiments.cli", "sweep", str(sweep_file), "--budget", "1h", "--commit"]
    child = subprocess.Popen(
        command, cwd=repo, env={**env, "PYTHONPATH": str(REPO)}, start_new_session=True, stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and child.poll() is None and len(_log(repo)) < 2:
        time.sleep(0.5)
    os.killpg(child.pid, signal.SIGKILL)  # the machine taken away mid-sweep
    child.wait()
    commits = _log(repo)
    assert len(commits) >= 2 and commits[0].startswith("Study record: study fedavg-seed0 ("), commits
    records = repo / "docs" / "claims" / "study" / "runs"
    committed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "docs/claims"], capture_output=True, text=True
    ).stdout.split()
    on_disk = sorted(p.relative_to(repo).as_posix() for p in records.glob("*.json.gz"))
    assert on_disk and committed == on_disk  # every record written is committed: none waits for the sweep's end
    assert read_record(records / "fedavg-seed0.json.gz")["name"] == "fedavg-seed0"
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "docs"], capture_output=True, text=True)
    assert status.stdout == ""


def test_two_documents_giving_one_claim_two_verdicts_are_caught() -> None:
    from experiments.studies.headline import conflicting_verdicts, document_verdicts

    study = "- **holds**: A above B (paper 1 vs 2); ours a 1 vs b 2 (acc), a - b = 3 over 3 seeds.\n"
    other = "- **undecided**: A above B (paper 1 vs 2). Decided by: more seeds.\n"
    headline = "| A above B (paper 1 vs 2) | [s](s.md) | a 1 vs b 2 | **holds** | 6 of 6 |\n"
    assert document_verdicts(study) == document_verdicts(headline) == {"A above B (paper 1 vs 2)": "holds"}
    assert conflicting_verdicts({"study.md": study, "results.md": headline}) == []
    assert conflicting_verdicts({"study.md": study, "other.md": other}) == [
        "'A above B (paper 1 vs 2)': undecided in other.md, holds in study.md"
    ]


def test_the_committed_documents_give_each_claim_one_verdict() -> None:
    from experiments.studies.headline import conflicting_verdicts

    documents = {
        p.relative_to(REPO).as_posix(): p.read_text()
        for p in sorted((REPO / "docs").rglob("*.md"))
        if "history" not in p.relative_to(REPO).parts
    }
    assert "docs/results.md" in documents and conflicting_verdicts(documents) == []


def test_a_claim_stated_by_two_study_files_is_refused(tmp_path: Path) -> None:
    from experiments.studies.headline import claim_verdicts

    claim = '\n[[claim]]\ntext = "FedAvg above Local"\ntable = "t"\na = "fedavg"\nb = "local"\nmetric = "acc-shift-0"\n'
    files = []
    for name in ("one", "two"):
        (tmp_path / f"{name}.toml").write_text(STUDY.replace('name = "study"', f'name = "{name}"') + claim)
        files.append(tmp_path / f"{name}.toml")
    studies = [study_state(f, read_sweep(f), lambda cases: {}, tmp_path / "none") for f in files]
    with pytest.raises(ConfigError, match="is in both"):
        claim_verdicts(studies)
    assert claim_verdicts(studies[:1])[0].found == "not run yet"


def test_results_check_sees_a_document_its_records_do_not_make(tmp_path: Path) -> None:
    sweep_file = _study_repo(tmp_path / "repo")
    repo = sweep_file.parent.parent
    env = {**os.environ, "PYTHONPATH": str(REPO), "PFL_CACHE_DIR": str(tmp_path / "cache")}
    pflower = [sys.executable, "-m", "experiments.cli", "results"]
    written = subprocess.run([*pflower, str(sweep_file)], cwd=repo, env=env, capture_output=True, text=True)
    assert written.returncode == 0, written.stderr
    assert "has a record yet. Its 4 runs are owed, ~0.0 hours" in (repo / "docs" / "study.md").read_text()
    check = subprocess.run([*pflower, "--check", str(sweep_file)], cwd=repo, env=env, capture_output=True, text=True)
    assert "0 of 4 runs current, 0 stale, 0 made with other settings, 4 missing" in check.stdout
    assert "document docs/study.md: as its records generate it" in check.stdout
    (repo / "docs" / "study.md").write_text("edited by hand\n")
    check = subprocess.run([*pflower, "--check", str(sweep_file)], cwd=repo, env=env, capture_output=True, text=True)
    assert check.returncode == 1 and "document docs/study.md: differs from what its records generate" in check.stdout


def test_one_files_check_and_headline_use_every_study_file(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "bench" / "sweeps").mkdir(parents=True)
    (repo / "docs").mkdir()
    (repo / "pyproject.toml").write_text("")
    for name in ("one", "two"):
        claim = f'\n[[claim]]\ntext = "FedAvg above Local in {name}"\ntable = "t"\na = "fedavg"\nb = "local"\n'
        text = STUDY.replace('name = "study"', f'name = "{name}"').replace("docs/study.md", f"docs/{name}.md")
        (repo / "bench" / "sweeps" / f"{name}.toml").write_text(text + claim + 'metric = "acc-shift-0"\n')
    subprocess.run(["git", "-C", str(repo), "init", "-q"], check=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PFL_CACHE_DIR": str(tmp_path / "cache")}
    pflower = [sys.executable, "-m", "experiments.cli", "results"]

    def results(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*pflower, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=300)

    assert results("--headline").returncode == 0
    headline = (repo / "docs" / "results.md").read_text()
    assert "in one |" in headline and "in two |" in headline
    for name in ("one", "two"):
        assert results(f"bench/sweeps/{name}.toml").returncode == 0
    check = results("--check", "bench/sweeps/one.toml")
    assert check.returncode == 0 and "(the headline table): as the records generate it" in check.stdout, check.stdout
    assert results("--headline", "bench/sweeps/one.toml").returncode == 0
    assert (repo / "docs" / "results.md").read_text() == headline  # not a table of one file's claims


def test_only_with_several_sweep_files_narrows_each_to_the_names_it_has() -> None:
    from experiments.cli.studies import only_patterns

    files = [REPO / "bench" / "sweeps" / name for name in ("results.toml", "distributed_dp.toml", "har_natural.toml")]
    sweeps = {file: read_sweep(file) for file in files}
    found = only_patterns(["fedampx-fedavg-plateau,all100-*"], sweeps)
    assert found == {files[0]: ["fedampx-fedavg-plateau"], files[1]: ["all100-*"], files[2]: []}
    with pytest.raises(ConfigError, match="--only: nope-\\*, nada names no experiment of the sweep files given"):
        only_patterns(["fedampx-fedavg-plateau,nope-*", "nada"], sweeps)
    assert only_patterns(None, sweeps) is None
    assert only_patterns(["nope"], {files[0]: sweeps[files[0]]}) == {files[0]: ["nope"]}  # narrow() lists the names
