"""The results document's headline claims: verdicts from the paired interval over seeds, the evidence quoted,
the budget that would decide an undecided one, bad [[claim]] entries refused; the global-rounds figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.hparams import ConfigError
from experiments.analysis.results_doc import write_results
from experiments.run.sweep import read_sweep
from tests.test_experiments import _fixture_run
from tests.test_results_doc import SWEEP

CLAIMS = """
[[claim]]
text = "DM-PFL above FedAvg at full shift"
table = "main"
a = "dmpfl"
b = "fedavg"
metric = "acc-shift-1"

[[claim]]
text = "DM-PFL moves fewer bytes"
table = "main"
a = "dmpfl"
b = "fedavg"
relation = "<"
metric = "mb-ratio"

[[claim]]
text = "DM-PFL+ above FedAvg at full shift"
table = "main"
a = "dmpfl+"
b = "fedavg"
metric = "acc-shift-1"
decide = "ten seeds"

[[claim]]
text = "Ditto above FedAvg"
table = "main"
a = "ditto"
b = "fedavg"
metric = "acc-shift-0"
decide = "a Ditto run"
"""


def _runs(root: Path, seeds: tuple[int, ...]) -> Path:
    fedavg = {0: (0.60, 0.40), 1: (0.64, 0.44)}
    dmpfl = {0: (0.70, 0.30), 1: (0.80, 0.34)}
    for seed in seeds:
        _fixture_run(root, f"fedavg-seed{seed}", "fedavg", seed, *fedavg[seed], 2.0, 1e9)
        _fixture_run(root, f"dmpfl-seed{seed}", "dmpfl", seed, *dmpfl[seed], 1.0, 5e8)
        path = root / f"dmpfl-seed{seed}" / "summary.json"
        summary = json.loads(path.read_text())
        summary["final"]["mean"].update({"plus-acc-shift-0": 0.5, "plus-acc-shift-1": 0.45 + 0.1 * seed})
        path.write_text(json.dumps(summary))
    return root


def _document(tmp_path: Path, seeds: tuple[int, ...], extra: str = "") -> str:
    sweep = tmp_path / "doc.toml"
    sweep.write_text(SWEEP + extra + CLAIMS)
    path, _, _ = write_results(sweep, _runs(tmp_path / "runs", seeds), tmp_path / "docs" / "results.md")
    return path.read_text()


def test_verdicts_follow_the_paired_interval_over_seeds(tmp_path: Path) -> None:
    text = _document(tmp_path, (0, 1))
    head, _, rest = text.partition("## The papers' headline claims")
    assert rest and "| table |" not in rest.split("\n\n")[1]  # the list opens the document, before the overview
    # 100%: dmpfl - fedavg = -10 points on both seeds: an interval of zero width below zero
    assert (
        "- **fails beyond the seeds' noise**: DM-PFL above FedAvg at full shift; ours dmpfl 32.00 +/- 25.41 vs "
        "fedavg 42.00 +/- 25.41 (acc-shift-1, last round; the paper does not say which round it reports), "
        "dmpfl - fedavg = -10.00 +/- 0.00 over 2 seeds." in text
    )
    # bytes: 0.5 of FedAvg's on both seeds, claimed below
    assert "- **holds**: DM-PFL moves fewer bytes; ours dmpfl 0.500 +/- 0.000 vs fedavg 1.000 +/- 0.000" in text
    # DM-PFL+ at 100%: +5 and +11 points, an interval over two seeds that spans zero
    assert "- **undecided**: DM-PFL+ above FedAvg at full shift;" in text
    assert "dmpfl+ - fedavg = 8.00 +/- 38.12 over 2 seeds. Decided by: ten seeds." in text
    assert "- **not run yet**: Ditto above FedAvg. Decided by: a Ditto run." in text
    assert "Verdicts: 1 holds, 1 fails beyond the seeds' noise, 1 undecided, 1 not run yet." in text


def test_one_seed_decides_nothing(tmp_path: Path) -> None:
    text = _document(tmp_path, (0,))
    assert "- **undecided**: DM-PFL moves fewer bytes;" in text
    assert "dmpfl - fedavg = -0.500 over 1 seed (one seed: no interval)." in text
    assert "**holds**" not in text and "**fails" not in text


OFFSET_CLAIMS = """
[[claim]]
text = "DM-PFL within 8 points of FedAvg at full shift"
table = "main"
a = "dmpfl"
b = "fedavg"
metric = "acc-shift-1"
offset = -0.08

[[claim]]
text = "DM-PFL within 12 points of FedAvg at full shift"
table = "main"
a = "dmpfl"
b = "fedavg"
metric = "acc-shift-1"
offset = -0.12
"""


def test_an_offset_moves_the_bar_the_paired_difference_must_clear(tmp_path: Path) -> None:
    """dmpfl - fedavg = -10 points on both seeds: beyond 8 points below (fails), within 12 (holds)."""
    text = _document(tmp_path, (0, 1), OFFSET_CLAIMS)
    assert (
        "- **fails beyond the seeds' noise**: DM-PFL within 8 points of FedAvg at full shift; ours dmpfl 32.00 +/- "
        "25.41 vs fedavg 42.00 +/- 25.41 (acc-shift-1, last round; the paper does not say which round it reports), "
        "dmpfl - fedavg = -10.00 +/- 0.00 against -8.00 over 2 seeds." in text
    )
    assert "- **holds**: DM-PFL within 12 points of FedAvg at full shift;" in text


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        ("text = 'x'\ntable = 'main'\na = 'dmpfl'\nb = 'fedavg'\nmetric = 'm'\noffset = 'a'\n", "`offset` must"),
        ("text = 'x'\ntable = 'other'\na = 'dmpfl'\nb = 'fedavg'\nmetric = 'acc-shift-0'\n", "table 'other' is not"),
        ("text = 'x'\ntable = 'main'\na = 'local'\nb = 'fedavg'\nmetric = 'acc-shift-0'\n", "a = 'local' is not a row"),
        ("text = 'x'\ntable = 'main'\na = 'dmpfl'\nb = 'fedavg'\nmetric = 'm'\nrelation = '>='\n", "relation must"),
        ("text = 'x'\ntable = 'main'\na = 'dmpfl'\nb = 'fedavg'\nmetric = 'm'\nverdict = 'holds'\n", "unknown key"),
        ("table = 'main'\na = 'dmpfl'\nb = 'fedavg'\nmetric = 'm'\n", "`text` must be"),
    ],
)
def test_bad_claims_are_refused_in_one_line(tmp_path: Path, claim: str, message: str) -> None:
    sweep = tmp_path / "bad.toml"
    sweep.write_text(SWEEP + "[[claim]]\n" + claim)
    with pytest.raises(ConfigError, match=message):
        read_sweep(sweep)


def test_the_global_rounds_figure_draws_the_named_rows(tmp_path: Path) -> None:
    extra = SWEEP.replace('id = "main"', 'id = "rounds"').replace('title = "Main table"', 'title = "Rounds"')
    extra = extra[extra.index("[[table]]") :].replace('figures = ["shift"]', 'figures = ["global-rounds"]')
    extra = extra.replace('notes = "Why ours differ."', 'notes = ""\nround-rows = ["fedavg", "dmpfl"]')
    text = _document(tmp_path, (0, 1), extra)
    figure = tmp_path / "docs" / "figures" / "rounds" / "global_per_round.png"
    assert figure.stat().st_size > 5_000 and "](figures/rounds/global_per_round.png)" in text
    assert not (tmp_path / "docs" / "figures" / "main" / "global_per_round.png").exists()  # not asked for there
    sweep = tmp_path / "stray.toml"
    sweep.write_text(SWEEP + extra.replace('round-rows = ["fedavg", "dmpfl"]', 'round-rows = ["fedprox"]'))
    with pytest.raises(ConfigError, match="round-rows \\['fedprox'\\] are not among its rows"):
        read_sweep(sweep)


def test_a_sweep_titles_its_document(tmp_path: Path) -> None:
    assert _document(tmp_path, (0,)).startswith("# Results: the seed papers' comparisons on this implementation\n")
    sweep = tmp_path / "titled.toml"
    sweep.write_text('title = "At the paper\'s budget"\n' + SWEEP)
    path, _, _ = write_results(sweep, tmp_path / "runs", tmp_path / "titled.md")
    assert path.read_text().startswith("# At the paper's budget\n")
    sweep.write_text('title = ""\n' + SWEEP)
    with pytest.raises(ConfigError, match="`title` must be a non-empty string"):
        read_sweep(sweep)


def test_only_narrows_the_document_to_some_experiments(tmp_path: Path) -> None:
    sweep = tmp_path / "doc.toml"
    sweep.write_text(SWEEP + CLAIMS)
    runs = _runs(tmp_path / "runs", (0, 1))
    path, done, total = write_results(sweep, runs, tmp_path / "docs" / "only.md", only="dmpfl,dit*")
    text = path.read_text()
    assert (done, total) == (2, 4)  # dmpfl's two seeds of dmpfl and ditto's four runs
    table = text[text.index("| row |") :].split("\n\n")[0]
    assert "| dmpfl |" in table and "| dmpfl+ |" in table and "| ditto |" in table and "| fedavg |" not in table
    assert "MB x FedAvg" in table and "| - |" in table  # the ratio column without its baseline: no number
    assert "## The papers' headline claims" not in text  # every claim compares with fedavg, which is left out
    assert "`pflower sweep …/doc.toml --only 'dmpfl,dit*'` makes them" in text and str(tmp_path) not in text
    narrowed = write_results(sweep, runs, tmp_path / "docs" / "pair.md", only="fedavg,dmpfl")[0].read_text()
    assert "Verdicts: 1 holds, 1 fails beyond the seeds' noise, 1 undecided." in narrowed  # Ditto's claim dropped
    with pytest.raises(ConfigError, match="--only: fedprox names no experiment of the sweep; its experiments: fedavg"):
        write_results(sweep, runs, tmp_path / "docs" / "x.md", only="fedprox,dmpfl")


def test_a_paper_that_reports_the_best_round_is_compared_at_ours(tmp_path: Path) -> None:
    """paper-statistic = "best": the paper's column says so, and the verdicts read the best round (the fixture's
    best round has fedavg 67 / dmpfl 80 at 0% where the last has 62 / 75; at 100% both are the last's)."""
    sweep = tmp_path / "doc.toml"
    sweep.write_text(SWEEP.replace('id = "main"\n', 'id = "main"\npaper-statistic = "best"\n', 1) + CLAIMS)
    path, _, _ = write_results(sweep, _runs(tmp_path / "runs", (0, 1)), tmp_path / "docs" / "results.md")
    text = path.read_text()
    assert "| 0% (paper, best round) |" in text and "compared at our best round" in text
    assert "(acc-shift-1, best round, the paper's statistic), dmpfl - fedavg = -10.00 +/- 0.00" in text
    bad = tmp_path / "bad.toml"
    bad.write_text(SWEEP.replace('id = "main"\n', 'id = "main"\npaper-statistic = "peak"\n', 1))
    with pytest.raises(ConfigError, match="paper-statistic: 'peak' is not one of last, best, unknown"):
        read_sweep(bad)
