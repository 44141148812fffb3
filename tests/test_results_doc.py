"""`pflower results`: sweep groups, [[table]] checks, metric readers and the document's exact cells, paper numbers
and order differences, from hand-made run folders."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from common.hparams import ConfigError
from experiments import cli
from experiments.analysis.collect import Run
from experiments.analysis.results_doc import write_results
from experiments.analysis.tables import metric_reader
from experiments.run.sweep import load_sweep, load_tables
from tests.gitrepo import one_commit_checkout
from tests.test_experiments import _fixture_run

REPO = Path(__file__).resolve().parents[1]
T95_2 = 12.706204736174707  # Student t, 97.5%, 1 degree of freedom


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_groups_merge_defaults_group_and_experiment_in_that_order(tmp_path: Path) -> None:
    text = """
seeds = [0]
[defaults]
lr = 0.1
local-epochs = 3
[groups.g]
lr = 0.2
seeds = [1, 2]
clients = 7
[[experiment]]
name = "a"
group = "g"
local-epochs = 4
[[experiment]]
name = "b"
"""
    _, specs = load_sweep(_write(tmp_path / "s.toml", text))
    a = [s for s in specs if s.experiment == "a"]
    assert [s.seed for s in a] == [1, 2] and {s.clients for s in a} == {7}
    assert a[0].run_config["lr"] == 0.2 and a[0].run_config["local-epochs"] == 4
    assert "clients" not in a[0].run_config and "seeds" not in a[0].run_config
    b = [s for s in specs if s.experiment == "b"]
    assert [s.seed for s in b] == [0] and b[0].run_config["lr"] == 0.1 and b[0].run_config["local-epochs"] == 3
    with pytest.raises(ConfigError, match="group 'h' is not one of \\[groups.\\*\\]: g"):
        load_sweep(_write(tmp_path / "s.toml", text + "[[experiment]]\nname = 'c'\ngroup = 'h'\n"))
    with pytest.raises(ConfigError, match="experiment a: .*lr"):
        load_sweep(_write(tmp_path / "s.toml", text.replace("lr = 0.2", "lr = -1.0")))


def test_the_committed_results_sweep_and_its_tables_load() -> None:
    name, specs = load_sweep(REPO / "bench" / "sweeps" / "results.toml")
    tables = load_tables(REPO / "bench" / "sweeps" / "results.toml")
    assert name == "results" and {s.seed for s in specs} == {0, 1, 2}
    assert any(row.endswith(" (cloud model)") for table in tables for row in table.rows)
    for table in tables:
        for values in table.paper.values():
            assert len(values) == len(table.columns)
    assert {"dmpfl-mnist", "dmpfl-cifar", "fedamp-mnist", "fliu-path", "dapperfl-digits"} <= {t.id for t in tables}


def test_bad_tables_are_refused_in_one_line(tmp_path: Path) -> None:
    head = "[[experiment]]\nname = 'a'\n[[experiment]]\nname = 'b'\nalgorithm = 'dmpfl'\n"
    cases = {
        "[[table]]\nid = 'x'\nrows = ['b (cloud model)']\n": "row 'b \\(cloud model\\)': dmpfl reports no "
        "'\\(cloud model\\)' row \\(its extra rows: '\\+'",
        "[[table]]\nid = 'x'\nrows = ['a']\ncolour = 1\n": "unknown key",
        "[[table]]\nid = 'x y'\nrows = ['a']\n": "`id` must be",
        "[[table]]\nid = 'x'\nrows = ['c']\n": "row 'c' names no experiment",
        "[[table]]\nid = 'x'\nrows = []\n": "no rows",
        "[[table]]\nid = 'x'\nrows = ['a']\ncolumns = [{label = 'acc'}]\n": "needs a `label` and a `metric`",
        "[[table]]\nid = 'x'\nrows = ['a']\ncolumns = [{label = 'acc', metric = 'acc-shift-0'}]\n"
        "[table.paper]\nb = [1.0]\n": "paper numbers for 'b', which is not one of its rows",
        "[[table]]\nid = 'x'\nrows = ['a']\ncolumns = [{label = 'acc', metric = 'acc-shift-0'}]\n"
        "[table.paper]\na = [1.0, 2.0]\n": "must be 1 numbers",
        "[[table]]\nid = 'x'\nrows = ['a']\nsections = ['pie']\n": "sections: unknown \\['pie'\\]",
        "[[table]]\nid = 'x'\nrows = ['a']\nbaseline = 'b'\n": "baseline 'b' is not one of its rows",
    }
    for text, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_sweep(_write(tmp_path / "s.toml", head + text))
        with pytest.raises(ConfigError, match=message):
            load_tables(_write(tmp_path / "s.toml", head + text))
    load_tables(_write(tmp_path / "s.toml", head + "[[table]]\nid = 'x'\nrows = ['a', 'b+', 'b (global model)']\n"))
    with pytest.raises(ConfigError, match="row 'a\\+': fedavg reports no '\\+' row \\(it reports none\\)"):
        load_tables(_write(tmp_path / "s.toml", head + "[[table]]\nid = 'x'\nrows = ['a+']\n"))  # the default
    grouped = "[groups.g]\nalgorithm = 'fedamp'\n[[experiment]]\nname = 'c'\ngroup = 'g'\n"
    load_sweep(_write(tmp_path / "s.toml", head + grouped + "[[table]]\nid = 'x'\nrows = ['c (cloud model)']\n"))
    with pytest.raises(ConfigError, match="no \\[\\[table\\]\\] entries"):
        load_tables(_write(tmp_path / "s.toml", head))


def test_metric_readers_read_each_kind_of_value() -> None:
    summary = {
        "final": {
            "mean": {
                "acc-shift-0": 0.5,
                "plus-acc-shift-0": 0.6,
                "acc-corrupt-fog-1": 0.4,
                "acc-corrupt-fog-3": 0.2,
                "acc-corrupt-contrast-1": 0.3,
                "domain-mnist-acc": 0.9,
                "domain-syn-acc": 0.3,
            },
            "std": {"acc-shift-0": 0.05},
        },
        "unseen": {"mean": {"acc-shift-0": 0.25}},
        "stages": {"L2": {"acc_local": [0.8, 0.1], "acc_global": [0.4, 0.1]}},
        "mb_per_client": {"train_down": 1.5, "train_up": 0.5},
        "train_flops_per_client": 3e9,
        "rounds_completed": 57,
    }
    records = [
        {
            "round": r,
            "eval": {
                "mean": {
                    "acc-shift-0": acc,
                    "cloud-acc-shift-0": cloud,
                    "domain-mnist-acc": mnist,
                    "domain-syn-acc": syn,
                }
            },
        }
        for r, acc, cloud, mnist, syn in ((1, 0.7, 0.6, 0.8, 0.3), (2, 0.5, 0.8, 0.9, 0.1))
    ]
    run = Run(Path("x"), {"seed": 0}, summary, records)
    expected = {
        ("acc-shift-0", ""): 0.5,
        ("acc-shift-0", "plus-"): 0.6,
        ("best:acc-shift-0", ""): 0.7,
        ("std:acc-shift-0", ""): 0.05,
        ("unseen:acc-shift-0", ""): 0.25,
        ("stage:L2:acc_global", ""): 0.4,
        ("corrupt", ""): 0.3,
        ("corrupt:1", ""): 0.35,
        ("corrupt:3", ""): 0.2,
        ("domains", ""): 0.6,
        ("mb", ""): 2.0,
        ("flops", ""): 3e9,
        ("rounds", ""): 57,
        ("best-round", ""): 1,
        ("best:cloud-acc-shift-0", ""): 0.6,  # an extra row's value at the main accuracy's best round
        ("best-round", "cloud-"): 1,  # the round that 'best:' reads, for every row of the run
        ("best:domains", ""): 0.55,  # round 1's domains
        ("max:cloud-acc-shift-0", ""): 0.8,  # each key its own best round: round 2 here
        ("max:domain-mnist-acc", ""): 0.9,
        ("max:domain-syn-acc", ""): 0.3,
        ("max:domains", ""): 0.55,  # the best round of the domains' mean (0.55 against 0.5), not each domain's
    }
    for (metric, prefix), value in expected.items():
        assert math.isclose(metric_reader(metric, prefix)(run), value), metric
    for missing in ("acc-shift-1", "best:acc-shift-1", "max:acc-shift-1", "stage:G:acc_global", "corrupt:5"):
        assert math.isnan(metric_reader(missing)(run)), missing
    assert math.isnan(metric_reader("unseen:acc-shift-1")(run))


SWEEP_HEAD = """
name = "doc"
preset = "smoke"
seeds = [0, 1]
[[experiment]]
name = "fedavg"
algorithm = "fedavg"
"""
SWEEP = (
    SWEEP_HEAD
    + """[[experiment]]
name = "dmpfl"
algorithm = "dmpfl"
[[experiment]]
name = "ditto"
algorithm = "ditto"

[[table]]
id = "main"
title = "Main table"
source = "a paper, Table 9"
rows = ["fedavg", "dmpfl", "dmpfl+", "ditto"]
baseline = "fedavg"
columns = [{ label = "0%", metric = "acc-shift-0" }, { label = "100%", metric = "acc-shift-1" },
           { label = "MB x FedAvg", metric = "mb-ratio" }]
sections = ["paired"]
figures = ["shift"]
notes = "Why ours differ."
[table.paper]
fedavg = [50.0, 45.0, 1.0]
dmpfl = [70.0, 46.0, 0.4]
"dmpfl+" = [69.0, 41.0, nan]
ditto = [60.0, 44.0, 1.0]
"""
)


def test_the_results_document_holds_the_runs_numbers_the_papers_and_the_order_differences(tmp_path: Path) -> None:
    sweep = _write(tmp_path / "doc.toml", SWEEP)
    runs = tmp_path / "runs"
    _fixture_run(runs, "fedavg-seed0", "fedavg", 0, 0.60, 0.40, 2.0, 1e9)
    _fixture_run(runs, "fedavg-seed1", "fedavg", 1, 0.64, 0.44, 2.0, 1e9)
    _fixture_run(runs, "dmpfl-seed0", "dmpfl", 0, 0.70, 0.30, 1.0, 5e8)
    _fixture_run(runs, "dmpfl-seed1", "dmpfl", 1, 0.80, 0.34, 1.0, 5e8)
    for seed in (0, 1):  # DM-PFL+'s row: 'plus-' keys of the same runs
        path = runs / f"dmpfl-seed{seed}" / "summary.json"
        summary = json.loads(path.read_text())
        summary["final"]["mean"].update({"plus-acc-shift-0": 0.5, "plus-acc-shift-1": 0.45 + 0.1 * seed})
        path.write_text(json.dumps(summary))
    out = tmp_path / "docs" / "results.md"
    path, done, total = write_results(sweep, runs, out, "pflower results doc.toml")
    text = path.read_text()
    assert (done, total) == (4, 6)
    assert "Generated by `pflower results doc.toml`" in text and "from 4 of 6 runs" in text
    assert "**Incomplete:** 2 runs have not finished" in text

    def half(gap: float) -> str:  # the interval's half-width for two values `gap` apart (s = gap / sqrt 2)
        return f"{100 * T95_2 * gap / math.sqrt(2) / math.sqrt(2):.2f}"

    assert (
        "| row | seeds | 0%, last round (ours) | 0%, best round (ours) | 0% (paper) | 100%, last round (ours) | "
        "100%, best round (ours) | 100% (paper) | MB x FedAvg (ours) | MB x FedAvg (paper) |" in text
    )
    h = half(0.04)
    assert (
        f"| fedavg | 2 | 62.00 +/- {h} | 67.00 +/- {h} | 50.00 | 42.00 +/- {h} | 42.00 +/- {h} | 45.00 | 1.000 |"
        in text
    )
    assert f"| dmpfl+ | 2 | 50.00 +/- 0.00 | n/a | 69.00 | 50.00 +/- {half(0.1)} | n/a | 41.00 | 0.500 | - |" in text
    assert (
        "| dmpfl | 2 | 75.00 +/- 63.53 | 80.00 +/- 63.53 | 70.00 | 32.00 +/- 25.41 | 32.00 +/- 25.41 | 46.00 |" in text
    )
    assert "| ditto | not run yet |  |  | 60.00 |  |  | 44.00 |  | 1.000 |" in text
    assert "the paper does not say which round it reports: its order and claims are compared at our last round" in text
    # 0%: paper dmpfl 70 > dmpfl+ 69 > fedavg 50 (ditto not run); ours dmpfl 75 > fedavg 62 > dmpfl+ 50
    assert "- 0%: paper dmpfl 70.00 > fedavg 50.00" not in text and "- 0%: paper dmpfl 70.00 > dmpfl+" not in text
    assert (
        f"- 0%: paper dmpfl+ 69.00 > fedavg 50.00; ours 50.00 +/- 0.00 vs 62.00 +/- {half(0.04)}, "
        f"paired difference -12.00 +/- {half(0.04)} (n=2, within the seeds' noise)"
    ) in text
    # 100%: paper dmpfl 46 > fedavg 45 > dmpfl+ 41; ours dmpfl+ 50 > fedavg 42 > dmpfl 32; dmpfl - fedavg is -10
    # on both seeds: an interval of zero width below zero
    assert (
        "- 100%: paper dmpfl 46.00 > fedavg 45.00; ours 32.00 +/- 25.41 vs 42.00 +/- 25.41, paired difference "
        "-10.00 +/- 0.00 (n=2, significant)" in text
    )
    assert "- 100%: paper dmpfl 46.00 > dmpfl+ 41.00" in text and "- 100%: paper fedavg 45.00 > dmpfl+ 41.00" in text
    assert "MB x FedAvg: paper" not in text  # ours 1.0 / 0.5 keep the paper's order
    # compared: 0% and 100% have 3 ordered pairs each (fedavg, dmpfl, dmpfl+), MB one (fedavg > dmpfl)
    assert (
        "(4 of the 7 ordered pairs with the paper's numbers, 1 beyond the seeds' noise; paper A > B, ours A < B)"
        in text
    )
    assert "| [Main table](#main-table) | 4 / 6 | 7 | 4 | 1 |" in text  # the overview at the top
    assert "Why ours differ." in text and "Paper: a paper, Table 9." in text
    # the note was written for the whole table: the row it may quote and this document lacks is named above it
    assert "(The note below was written for the whole table; its rows `ditto` are not in this document" in text
    assert (tmp_path / "docs" / "figures" / "main" / "accuracy_vs_shift.png").stat().st_size > 5_000
    assert "](figures/main/accuracy_vs_shift.png)" in text
    assert "(app commit; '+changes': uncommitted edits of the code): not recorded (4 runs)." in text
    with pytest.raises(ConfigError, match="no finished run"):
        write_results(sweep, tmp_path / "empty", out)


def test_round_counts_are_shown_per_seed_not_as_a_mean(tmp_path: Path) -> None:
    sweep = _write(
        tmp_path / "doc.toml",
        SWEEP_HEAD
        + """
[[table]]
id = "plateau"
rows = ["fedavg"]
columns = [{ label = "best", metric = "best:acc-shift-0" }, { label = "best round", metric = "best-round" },
           { label = "rounds", metric = "rounds" }]
[table.paper]
fedavg = [50.0, nan, 90.0]
""",
    )
    runs = tmp_path / "runs"
    for seed, rounds in enumerate((56, 72)):  # the fixture's best evaluation is its round 1
        _fixture_run(runs, f"fedavg-seed{seed}", "fedavg", seed, 0.6, 0.4, 2.0, 1e9)
        path = runs / f"fedavg-seed{seed}" / "summary.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "rounds_completed": rounds}))
    text = write_results(sweep, runs, tmp_path / "out.md")[0].read_text()
    assert "| fedavg | 2 | 65.00 +/- 0.00 | 50.00 | 1, 1 | 56, 72 | 90 |" in text  # no paper column without a number


def test_each_run_records_the_commits_that_made_it_and_the_document_counts_them(tmp_path: Path) -> None:
    from experiments.analysis.results_doc import code_line
    from experiments.run.runs import app_commit, record_code, run_commits

    runs = [tmp_path / name for name in ("a", "b", "c")]
    for run in runs:
        run.mkdir()
    record_code(runs[0], "abc1234")
    record_code(runs[0], "abc1234")  # the same commit again: one entry
    record_code(runs[0], "def5678+changes")  # resumed under other code: both kept, in order
    record_code(runs[1], "abc1234")
    record_code(runs[2], "")  # not a checkout: nothing recorded
    assert run_commits(runs[0]) == ["abc1234", "def5678+changes"] and run_commits(runs[2]) == []
    (runs[2] / "code.json").write_text("[1, 2")  # damaged: read as nothing recorded
    assert run_commits(runs[2]) == []
    assert code_line(runs) == (
        "Code that made the runs (app commit; '+changes': uncommitted edits of the code): abc1234 (2 runs), "
        "def5678+changes (1 run), not recorded (1 run)."
    )
    app = tmp_path / "app"
    app.mkdir()
    assert app_commit(app) == ""  # not a git checkout
    head = one_commit_checkout(app, ["docs/a.md", "bench/sweeps/s.toml", "README.md"])
    assert app_commit(app) == head
    for edited in ("docs/a.md", "bench/sweeps/s.toml", "README.md"):  # not code: a run's numbers do not change
        (app / edited).write_text("edited\n")
    assert app_commit(app) == head
    (app / "f.py").write_text("x = 2\n")
    assert app_commit(app) == head + "+changes"


def test_the_cli_writes_the_document_and_says_how_many_runs_it_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = _write(tmp_path / "doc.toml", SWEEP)
    _fixture_run(tmp_path / "runs", "fedavg-seed0", "fedavg", 0, 0.60, 0.40, 2.0, 1e9)
    out = tmp_path / "r.md"
    assert cli.main(["results", str(sweep), "--runs", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert f"results: {out.resolve()} (1 of 6 runs finished)" in capsys.readouterr().out
    text = out.read_text()
    assert "| fedavg | 1 | 60.00 | 65.00 | 50.00 | 40.00 | 40.00 | 45.00 | 1.000 | 1.000 |" in text
    assert "No two rows with the paper's numbers have finished on shared seeds yet." in text
    # no absolute path of this machine in a document meant to be committed
    assert str(tmp_path) not in text and "`pflower results …/doc.toml --runs …/runs --out …/r.md`" in text
    assert cli.main(["results", str(tmp_path / "missing.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cost_ratios_pair_each_seed_with_the_baselines_run_of_that_seed(tmp_path: Path) -> None:
    from experiments.analysis.collect import find_runs, group_runs
    from experiments.analysis.results_doc import _values
    from experiments.analysis.tables import Column, TableSpec

    _fixture_run(tmp_path, "base-seed0", "fedavg", 0, 0.6, 0.4, 2.0, 1e9)
    _fixture_run(tmp_path, "base-seed1", "fedavg", 1, 0.6, 0.4, 4.0, 2e9)
    _fixture_run(tmp_path, "x-seed1", "dmpfl", 1, 0.6, 0.4, 2.0, 1e9)  # only seed 1 has finished
    groups = group_runs(find_runs([tmp_path]))
    spec = TableSpec("t", "t", "", "", ("base", "x"), "base", (), {}, (), (), "")
    assert _values(groups, spec, "x", Column("MB", "mb-ratio")) == {1: 0.5}  # not 2.0 / mean(2.0, 4.0)
    assert _values(groups, spec, "x", Column("FLOPs", "flops-ratio")) == {1: 0.5}
    assert _values(groups, spec, "base", Column("MB", "mb-ratio")) == {0: 1.0, 1: 1.0}


def test_a_figure_of_many_panels_wraps_into_rows_of_five() -> None:
    from experiments.analysis.figures import PANELS_PER_ROW, _panels, pyplot

    plt = pyplot()
    for count, rows in ((3, 1), (5, 1), (7, 2), (10, 2)):
        fig, axes = _panels(plt, count, 4.0, 3.0)
        grid = fig.axes
        assert len(axes) == count and len(grid) == rows * min(count, PANELS_PER_ROW)
        assert [ax.get_visible() for ax in grid] == [True] * count + [False] * (len(grid) - count)
        assert tuple(fig.get_size_inches()) == (4.0 * min(count, PANELS_PER_ROW), 3.0 * rows)
        plt.close(fig)
