"""Report figures that do not mislead: no offset notation on an axis (a minimum span around nearly equal values),
series dodged along x so that no error bar hides another, the best round drawn only where it differs from the last."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from experiments.analysis.figures import differs, dodged, minimum_span, plain_axes

pytest.importorskip("matplotlib")


def _record_error_bars(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, str], tuple[list[float], list[float]]]:
    """What the figures draw as error bars, filled in as each figure is saved: (panel title, label) -> (x, y), y
    rounded to 6 places."""
    from experiments.analysis import figures

    drawn: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    real = figures.pyplot

    def recording():  # type: ignore[no-untyped-def]
        plt = real()
        save = plt.Figure.savefig

        def savefig(fig, *args, **kwargs):  # type: ignore[no-untyped-def]
            for ax in fig.axes:
                for container in ax.containers:
                    line = container.lines[0]
                    xy = ([float(v) for v in line.get_xdata()], [round(float(v), 6) for v in line.get_ydata()])
                    drawn[(ax.get_title(), container.get_label())] = xy
            return save(fig, *args, **kwargs)

        monkeypatch.setattr(plt.Figure, "savefig", savefig)
        return plt

    monkeypatch.setattr(figures, "pyplot", recording)
    return drawn


def test_series_are_dodged_symmetrically_within_the_smallest_gap() -> None:
    x = [0.0, 20.0, 40.0, 100.0]
    shifted = [dodged(x, i, 3) for i in range(3)]
    assert shifted[1] == x  # the middle one stays
    assert [a - b for a, b in zip(shifted[0], x)] == pytest.approx([-10 / 3] * 4)  # 20 * 0.5 / 3 to the left
    assert all(len({s[k] for s in shifted}) == 3 for k in range(4)), "no two series share an x"
    assert max(s[0] for s in shifted) - min(s[0] for s in shifted) < 20, "within the gap to the next degree"


def test_best_round_counts_as_different_only_where_a_number_differs() -> None:
    assert not differs([60.0, 50.0, float("nan")], [60.0, 50.0, 40.0])
    assert differs([60.0, 51.0], [60.0, 50.0])


def test_nearly_equal_values_get_a_minimum_span_and_spread_ones_none() -> None:
    low, high = minimum_span([6.153680, 6.153687])  # a 7-byte difference in MB
    assert high - low >= 0.05 * 6.15 and low < 6.15368 < 6.153687 < high
    assert minimum_span([1.0, 2.0]) is None
    assert minimum_span([0.0, 0.0]) == pytest.approx((-0.0006, 0.0006))


def test_an_axis_of_nearly_equal_values_has_no_offset_text() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    x = [6.153680, 6.153687]
    ax.plot(x, [50.0, 60.0], "o")
    fig.canvas.draw()
    assert ax.xaxis.get_offset_text().get_text() != "", "matplotlib alone writes an offset here"
    plain_axes(ax, x)
    fig.canvas.draw()
    assert ax.xaxis.get_offset_text().get_text() == ""
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert all("e" not in t and "+" not in t for t in labels) and any(t.startswith("6.") for t in labels)
    plt.close(fig)


def test_the_shift_figure_draws_the_best_round_only_where_it_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from experiments.analysis import figures
    from experiments.analysis.collect import find_runs, group_runs

    for name, best_gap in (("same", 0.0), ("better-earlier", 0.1)):
        run = tmp_path / f"{name}-seed0"
        run.mkdir()
        final = {"mean": {"acc-shift-0": 0.5, "acc-shift-1": 0.4}, "std": {"acc-shift-0": 0.1, "acc-shift-1": 0.1}}
        early = {"mean": {"acc-shift-0": 0.5 + best_gap, "acc-shift-1": 0.4}, "std": final["std"]}
        records = [{"round": 1, "eval": early}, {"round": 2, "eval": final}]
        summary = {"algorithm": "fedavg", "final": final, "shift_degrees": [0.0, 1.0], "final_round": 2}
        (run / "config.json").write_text(json.dumps({"algorithm": "fedavg", "seed": 0}))
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (run / "summary.json").write_text(json.dumps(summary))
    labels: list[str] = []
    real = figures.pyplot

    def recording():  # type: ignore[no-untyped-def]
        plt = real()
        save = plt.Figure.savefig

        def savefig(fig, *args, **kwargs):  # type: ignore[no-untyped-def]
            labels.extend(t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts())
            return save(fig, *args, **kwargs)

        monkeypatch.setattr(plt.Figure, "savefig", savefig)
        return plt

    monkeypatch.setattr(figures, "pyplot", recording)
    figures.accuracy_vs_shift(group_runs(find_runs([tmp_path])), tmp_path)
    assert sorted(labels) == ["better-earlier (best round)", "better-earlier (last)", "same (last)"]


def test_the_shift_figure_draws_a_tables_derived_rows_from_their_own_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A results table's DM-PFL+ and global-model rows are lines of the shift figure, read from their prefixed
    metrics ('plus-', 'global-'), not copies of the main model's."""
    from experiments.analysis import figures
    from experiments.analysis.collect import find_runs, group_runs
    from experiments.analysis.tables import find_row

    run = tmp_path / "d-seed0"
    run.mkdir()
    means = {"acc-shift-0": 0.8, "acc-shift-1": 0.5, "plus-acc-shift-0": 0.7, "plus-acc-shift-1": 0.6}
    means |= {"global-acc-shift-0": 0.55, "global-acc-shift-1": 0.56}
    final = {"mean": means, "std": {k: 0.1 for k in means}}
    summary = {"algorithm": "dmpfl", "final": final, "shift_degrees": [0.0, 1.0], "final_round": 1}
    (run / "config.json").write_text(json.dumps({"algorithm": "dmpfl", "seed": 0}))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "eval": final}) + "\n")
    (run / "summary.json").write_text(json.dumps(summary))
    lines = _record_error_bars(monkeypatch)
    groups = group_runs(find_runs([tmp_path]))
    rows = [(found[0], found[1], row) for row in ("d", "d+", "d (global model)") if (found := find_row(groups, row))]
    figures.accuracy_vs_shift(groups, tmp_path, rows)
    rounded = {label: y for (_, label), (_, y) in lines.items()}
    assert rounded == {"d (last)": [80.0, 50.0], "d+ (last)": [70.0, 60.0], "d (global model) (last)": [55.0, 56.0]}


def test_the_privacy_figure_draws_accuracy_against_the_epsilon_each_run_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line per algorithm and evaluation row, x = the epsilon in the run's summary (the runs without DP at the
    right, labelled 'no DP'), y = that row's accuracy; the `epsilon` table metric reads the same number."""
    from experiments.analysis import figures
    from experiments.analysis.collect import find_runs, group_runs
    from experiments.analysis.tables import Column, find_row, metric_reader

    def run(name: str, algorithm: str, eps: float | None, acc: float) -> None:
        folder = tmp_path / f"{name}-seed0"
        folder.mkdir()
        means = {"acc-shift-0": acc, "acc-shift-1": acc - 0.1, "plus-acc-shift-0": acc + 0.01}
        means["plus-acc-shift-1"] = acc - 0.05
        final = {"mean": means, "std": {k: 0.0 for k in means}}
        summary: dict = {"algorithm": algorithm, "final": final, "shift_degrees": [0.0, 1.0], "final_round": 1}
        config = {"algorithm": algorithm, "seed": 0, "dp": "none"}
        if eps is not None:
            summary["dp"] = {"epsilon": eps, "mode": "central"}
            config |= {"dp": "central", "dp-target-epsilon": round(eps)}
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "metrics.jsonl").write_text(json.dumps({"round": 1, "eval": final}) + "\n")
        (folder / "summary.json").write_text(json.dumps(summary))

    run("a", "fedavg", None, 0.9)
    run("a-eps8", "fedavg", 7.98, 0.8)
    run("a-eps1", "fedavg", 0.99, 0.5)
    run("d", "dmpfl", None, 0.85)
    run("d-eps1", "dmpfl", 1.0, 0.6)
    drawn = _record_error_bars(monkeypatch)
    groups = group_runs(find_runs([tmp_path]))
    names = ("a", "a-eps8", "a-eps1", "d", "d-eps1", "d+", "d-eps1+")
    rows = [(found[0], found[1], row) for row in names if (found := find_row(groups, row))]
    assert figures.privacy_figure(rows, tmp_path) == "privacy.png"
    right = 7.98 * 4  # 'no DP'
    assert drawn[("test-time shift 0%", "fedavg")] == ([0.99, 7.98, right], [50.0, 80.0, 90.0])
    assert drawn[("test-time shift 100%", "fedavg")] == ([0.99, 7.98, right], [40.0, 70.0, 80.0])
    assert drawn[("test-time shift 0%", "dmpfl+")] == ([1.0, right], [61.0, 86.0])
    assert set(drawn) == {(f"test-time shift {d}%", s) for d in (0, 100) for s in ("fedavg", "dmpfl", "dmpfl+")}
    eps = metric_reader("epsilon")
    assert [eps(g.runs[0]) for g in groups if g.label == "a-eps8"] == [7.98]
    assert all(math.isnan(eps(g.runs[0])) for g in groups if g.label == "a")
    assert not Column("epsilon", "epsilon").percent


@pytest.mark.parametrize(
    ("values", "limits"),
    [
        ([52.5, 55.0], (50.0, 70.0)),  # a 2.5-point spread gets a 20-point axis from a multiple of 10
        ([91.0, 99.5], (80.0, 100.0)),  # never above 100
        ([3.0, 12.0], (0.0, 20.0)),  # never below 0
        ([35.0, 88.0], (30.0, 90.0)),
        ([float("nan")], (0.0, 100.0)),
    ],
)
def test_an_accuracy_axis_starts_at_a_stated_floor(values: list[float], limits: tuple[float, float]) -> None:
    from common.plotting import accuracy_label, accuracy_limits

    assert accuracy_limits(values) == limits
    assert accuracy_label(limits, "mean").endswith(f"; axis from {limits[0]:g}%") == (limits[0] > 0)


def test_audit_cells_pack_into_lines_as_wide_as_the_largest_batch() -> None:
    from experiments.audit.run import pack_cells

    # four batch-1 cells share a line of 8 (one slot between cells), an 8-wide cell takes a line alone
    assert pack_cells([1, 1, 1, 1, 1, 8, 8], 8) == [[(0, 0), (1, 2), (2, 4), (3, 6)], [(4, 0)], [(5, 0)], [(6, 0)]]
    assert pack_cells([3, 3, 2], 8) == [[(0, 0), (1, 4)], [(2, 0)]]


def test_a_run_figure_draws_every_model_the_run_reports_and_no_diagnostic(tmp_path: Path) -> None:
    """DM-PFL's run figures hold theta_c, DM-PFL+ and theta_g (they drew theta_c alone); the disagreement shares are
    diagnostics, not models; the title names the data set and setting."""
    from server_app.results.plots import plot_run, run_models, run_title

    means = {f"{p}acc-shift-{d}": 0.5 for p in ("", "plus-", "global-", "disagree-") for d in (0, 1)}
    final = {"mean": means, "std": {k: 0.1 for k in means}, "num_clients": 6}
    summary = {"algorithm": "dmpfl", "dataset": "digits", "partition": "dirichlet", "num_clients": 6, "seed": 3}
    summary |= {"final": final, "shift_degrees": [0.0, 1.0], "final_round": 2}
    assert run_models(summary) == [("", "theta_c"), ("plus-", "DM-PFL+"), ("global-", "global model")]  # type: ignore[arg-type]
    assert run_title(summary) == "dmpfl on digits (dirichlet, 6 clients, seed 3)"  # type: ignore[arg-type]
    fedavg = {**summary, "algorithm": "fedavg", "final": {**final, "mean": {"acc-shift-0": 0.5, "acc-shift-1": 0.4}}}
    assert run_models(fedavg) == [("", "main model")]  # type: ignore[arg-type]
    records = [{"round": r, "eval": final} for r in (1, 2)]
    plot_run(records, summary, tmp_path)  # type: ignore[arg-type]
    assert (tmp_path / "accuracy_vs_round.png").is_file() and (tmp_path / "accuracy_vs_shift.png").is_file()
