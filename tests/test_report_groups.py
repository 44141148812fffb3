"""`pflower report` compares only runs of the same settings and names the runs it left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.hparams import ConfigError
from experiments.analysis.collect import by_settings, experiment_settings, find_runs, group_runs
from experiments.analysis.reports import write_report


def _run(root: Path, name: str, algorithm: str, clients: int, rounds: int, acc: float, **extra: object) -> None:
    run = root / name
    run.mkdir(parents=True)
    config = {"algorithm": algorithm, "dataset": "digits", "partition": "dirichlet", "num-rounds": rounds, "seed": 0}
    config.update(extra)
    final = {"mean": {"acc-shift-0": acc, "acc-shift-1": acc - 0.1}, "std": {"acc-shift-0": 0.1}}
    summary = {
        "algorithm": algorithm,
        "num_clients": clients,
        "final": final,
        "shift_degrees": [0.0, 1.0],
        "mb_per_client": {"train_down": 1.0, "train_up": 1.0},
        "train_flops_per_client": 1e9,
    }
    (run / "config.json").write_text(json.dumps(config))
    (run / "metrics.jsonl").write_text(json.dumps({"round": rounds, "eval": final}) + "\n")
    (run / "summary.json").write_text(json.dumps(summary))


def test_settings_ignore_algorithm_keys_seed_and_engine_keys(tmp_path: Path) -> None:
    _run(tmp_path, "a-seed0", "fedavg", 6, 2, 0.5, **{"client-threads": 1, "checkpoint-every": 1})
    _run(tmp_path, "b-seed0", "dmpfl", 6, 2, 0.6, **{"sparsity": 0.8, "client-threads": 4, "device": "cuda"})
    _run(tmp_path, "c-seed0", "fedavg", 6, 2, 0.6, **{"batch-size": 64})
    runs = find_runs([tmp_path])
    settings = experiment_settings(runs[0])
    assert settings["clients"] == 6 and "algorithm" not in settings and "seed" not in settings
    assert [[g.label for g in members] for members in by_settings(group_runs(runs))] == [["a", "b"], ["c"]]


def test_a_mixed_folder_gives_two_groups_and_no_cross_setting_pair(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _run(runs, "fedavg-quickstart-seed0", "fedavg", 10, 20, 0.9)
    _run(runs, "fedavg-smoke-seed0", "fedavg", 6, 2, 0.2)
    _run(runs, "dmpfl-smoke-seed0", "dmpfl", 6, 2, 0.3)
    _run(runs, "fedprox-other-seed0", "fedprox", 6, 2, 0.3, **{"dataset": "mnist"})
    text = write_report([runs], tmp_path / "report").read_text()
    assert "## Settings 1: digits, 6 clients, 2 rounds" in text  # in path order: dmpfl-smoke first
    assert "## Settings 2: digits, 10 clients, 20 rounds" in text
    assert "## Settings 3: mnist, 6 clients, 2 rounds" in text
    assert "- fedavg-quickstart-seed0 (digits, 10 clients, 20 rounds): no other algorithm ran this setting" in text
    assert "- fedprox-other-seed0 (mnist, 6 clients, 2 rounds): no other algorithm ran this setting" in text
    assert "dmpfl-smoke-seed0 (" not in text  # compared with fedavg-smoke, so not left out
    # the only paired row is dmpfl against the smoke fedavg (+10 points), never against the quick start's (-60)
    assert text.count("Paired difference to") == 1
    assert "Paired difference to `fedavg-smoke`" in text and "| dmpfl-smoke | 10.00" in text
    assert "-60.00" not in text and "nan" not in text  # no ratio to a baseline where a group has none
    assert (tmp_path / "report" / "settings2" / "costs.png").is_file()
    assert "![settings1/costs.png](settings1/costs.png)" in text


def test_one_setting_keeps_the_flat_report(tmp_path: Path) -> None:
    _run(tmp_path / "runs", "fedavg-seed0", "fedavg", 6, 2, 0.2)
    _run(tmp_path / "runs", "dmpfl-seed0", "dmpfl", 6, 2, 0.3)
    text = write_report([tmp_path / "runs"], tmp_path / "report").read_text()
    assert "## Settings" not in text and "Left out" not in text and "![costs.png](costs.png)" in text


def test_a_large_scale_goes_into_the_axis_label() -> None:
    from experiments.analysis.figures import _scaled

    assert _scaled([5e6, 2.05e7]) == ([5.0, 20.5], " (x 1e6)")
    assert _scaled([0.03, 0.18]) == ([0.03, 0.18], "")


def test_presets_lists_the_keys_each_preset_sets(capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.cli import main

    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "smoke: " in out and "  clients = 6\n" in out and "  num-rounds = 2\n" in out
    assert "  dataset = 'cifar10'\n" in out and "  num-rounds = 300\n" in out


def test_a_mixed_folder_is_grouped_by_folder_where_one_name_holds_two_experiments(tmp_path: Path) -> None:
    """A results folder holding a `pflower run` and a sweep of the same experiment name is reported, not refused."""
    results = tmp_path / "results"
    _run(results, "fedavg-digits-smoke-seed0", "fedavg", 6, 2, 0.5)
    _run(results / "smoke", "fedavg-digits-smoke-seed0", "fedavg", 6, 4, 0.6)  # other settings
    _run(results / "smoke", "fedavg-digits-smoke-seed1", "fedavg", 6, 4, 0.7, seed=1)
    _run(results / "again", "fedavg-digits-smoke-seed0", "fedavg", 6, 2, 0.55)  # same settings, seed 0 twice
    _run(results / "smoke", "dmpfl-seed0", "dmpfl", 6, 4, 0.8)
    groups = group_runs(find_runs([results]))
    assert {g.label: len(g.runs) for g in groups} == {
        "again/fedavg-digits-smoke": 1,
        "results/fedavg-digits-smoke": 1,
        "smoke/fedavg-digits-smoke": 2,
        "dmpfl": 1,
    }
    assert (write_report([results], tmp_path / "report")).is_file()


def test_one_folder_with_two_experiments_under_one_name_is_refused_with_both_paths(tmp_path: Path) -> None:
    _run(tmp_path / "a", "x-seed0", "fedavg", 6, 2, 0.5)
    _run(tmp_path / "a", "x-seed1", "fedavg", 6, 3, 0.5, seed=1)
    _run(tmp_path / "b", "x-seed0", "fedavg", 6, 2, 0.5)
    with pytest.raises(ConfigError, match=r"the runs of 'a/x' are not one experiment: .*x-seed1 and .*x-seed0 differ"):
        group_runs(find_runs([tmp_path]))


def test_three_seeds_need_no_few_seeds_note(tmp_path: Path) -> None:
    for seed in range(3):
        _run(tmp_path, f"a-seed{seed}", "fedavg", 6, 2, 0.5 + seed / 10, seed=seed)
    _run(tmp_path, "b-seed0", "dmpfl", 6, 2, 0.5)
    text = write_report([tmp_path], tmp_path / "report").read_text()
    assert "**Few seeds:** `b` (1) ran fewer than 3 seeds" in text and "`a` (" not in text


def test_a_report_without_matplotlib_is_written_without_figures_and_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A base install (a device, a bare server) reports too: the markdown, no figures, one line saying why."""
    import sys

    from experiments import cli

    _run(tmp_path / "runs", "a-seed0", "fedavg", 6, 2, 0.5)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    assert cli.main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "report")]) == 0
    captured = capsys.readouterr()
    skipped = "figures skipped: matplotlib is not installed (pip install 'pflower[reports]')"
    assert captured.err.splitlines() == [f"pflower: warning: {skipped}"]
    text = (tmp_path / "report" / "report.md").read_text()
    assert "Figures skipped: matplotlib is not installed" in text and "![" not in text
    assert not list((tmp_path / "report").rglob("*.png"))


RUN_FOLDER_FILES = ["config.json", "summary.json", "metrics.jsonl", "artifacts.npz", "code.json", "messages.jsonl"]
READ_BY_THE_REPORT = {"config.json", "summary.json", "metrics.jsonl", "artifacts.npz"}


@pytest.mark.parametrize("damaged", RUN_FOLDER_FILES)
@pytest.mark.parametrize("keep", [0.5, 0.0])
def test_a_damaged_run_folder_is_skipped_with_one_line(
    damaged: str, keep: float, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each file of a run folder cut short in turn: the report names that run, the file and the damage in one
    line and is written from the other runs (a file the report does not read leaves the run in)."""
    import numpy as np

    from experiments.cli import main

    runs = tmp_path / "runs"
    for name, acc in (("fedavg-seed0", 0.5), ("dmpfl-seed0", 0.6)):
        _run(runs, name, name.split("-")[0], 6, 2, acc)
        np.savez(runs / name / "artifacts.npz", overlap=np.arange(64, dtype=np.float32).reshape(8, 8))
        (runs / name / "code.json").write_text(json.dumps({"commits": ["abc1234"]}))
        (runs / name / "messages.jsonl").write_text(json.dumps({"round": 1, "digest": "00" * 32}) + "\n")
    target = runs / "dmpfl-seed0" / damaged
    data = target.read_bytes()
    target.write_bytes(data[: int(len(data) * keep)])
    assert main(["report", str(runs), "--out", str(tmp_path / "report")]) == 0
    captured = capsys.readouterr()
    text = (tmp_path / "report" / "report.md").read_text()
    skipped = [line for line in captured.err.splitlines() if line.startswith("skipped: ")]
    if damaged in READ_BY_THE_REPORT:
        assert len(skipped) == 1 and skipped[0].startswith(f"skipped: {runs / 'dmpfl-seed0'}: {damaged}: "), skipped
        assert "| dmpfl" not in text and "| fedavg" in text
    else:
        assert skipped == [] and "| dmpfl" in text
    assert "Traceback" not in captured.err


def test_a_report_whose_every_run_is_damaged_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from experiments.cli import main

    _run(tmp_path, "fedavg-seed0", "fedavg", 6, 2, 0.5)
    (tmp_path / "fedavg-seed0" / "summary.json").write_text('{"final": ')
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"skipped: {tmp_path / 'fedavg-seed0'}: summary.json: unreadable (")
    assert err[1].startswith("pflower: error: every finished run under") and len(err) == 2


def test_runs_set_aside_by_a_sweep_are_not_reported(tmp_path: Path) -> None:
    """`--replace` and a retry set runs aside under superseded/ (and the engine under incomplete/): a report of the
    sweep's folder leaves them out."""
    _run(tmp_path, "fedavg-seed0", "fedavg", 6, 2, 0.5)
    _run(tmp_path / "superseded", "fedavg-seed0-20261202-105849", "fedavg", 6, 2, 0.9)
    _run(tmp_path / "incomplete", "fedavg-seed1", "fedavg", 6, 2, 0.9, seed=1)
    assert [run.path for run in find_runs([tmp_path])] == [tmp_path / "fedavg-seed0"]
