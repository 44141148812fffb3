"""Results folder: summary numbers from round records, the markdown table, plots."""

from __future__ import annotations

import json

from server_app.results import ResultsWriter, summarize


def _record(rnd: int, acc: float, plus: float | None = None) -> dict:
    mean = {"acc-shift-0": acc, "acc-shift-1": acc - 0.1}
    if plus is not None:
        mean.update({"plus-acc-shift-0": plus, "plus-acc-shift-1": plus})
    return {
        "round": rnd,
        "wall_s": 1.5,
        "train": {"used": 2, "sent": 3, "flops": 10.0},
        "bytes": {"train_down": 1_000_000, "train_up": 500_000, "eval_down": 0, "eval_up": 0},
        "eval": {"num_clients": 4, "mean": mean, "std": dict.fromkeys(mean, 0.01)},
    }


def test_summary_totals_and_best() -> None:
    records = [_record(1, 0.5), _record(2, 0.8), _record(3, 0.7)]
    summary = summarize(records, {"num_clients": 4, "shift_degrees": [0.0, 1.0]})
    assert summary["best_mean_accuracy"] == 0.8 and summary["final_round"] == 3
    assert summary["mb_per_client"]["train_down"] == 0.75 and summary["mb_per_client"]["train_up"] == 0.375
    assert summary["train_flops_per_client"] == 7.5
    assert summary["replies_used"] == [2, 2, 2] and summary["wall_seconds"] == 4.5


def test_writer_files_and_variant_rows(tmp_path) -> None:
    writer = ResultsWriter(tmp_path, {"seed": 1})
    writer.add_round(_record(1, 0.6, plus=0.65))
    path = writer.finish({"algorithm": "dmpfl", "dataset": "digits", "num_clients": 4, "shift_degrees": [0.0, 1.0]})
    text = path.read_text()
    assert "| accuracy | 60.00 +/- 1.00 | 50.00 +/- 1.00 |" in text
    assert "| DM-PFL+ | 65.00 +/- 1.00 | 65.00 +/- 1.00 |" in text
    assert json.loads((tmp_path / "config.json").read_text()) == {"seed": 1}
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1
    assert (tmp_path / "accuracy_vs_round.png").stat().st_size > 1000


def test_a_run_without_matplotlib_finishes_with_one_warning_and_no_figures(tmp_path, monkeypatch, caplog) -> None:
    """A base install (a device, a bare server) has no matplotlib: the run's files are written, the figures are
    skipped with one line naming the extra, and nothing raises after the last round."""
    import logging
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    writer = ResultsWriter(tmp_path, {"seed": 1})
    writer.add_round(_record(1, 0.6))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        path = writer.finish({"algorithm": "fedavg", "dataset": "digits", "num_clients": 4, "shift_degrees": [0.0]})
    assert path.is_file() and (tmp_path / "summary.json").is_file()
    assert not list(tmp_path.glob("*.png"))
    assert caplog.text.count("figures skipped: matplotlib is not installed (pip install 'pflower[reports]')") == 1
