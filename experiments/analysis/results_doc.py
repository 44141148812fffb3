"""`pflower results`: one markdown document over a sweep's runs, a section per [[table]] of its file: the setting,
ours beside the paper's numbers (mean +/- 95% CI over seeds), every pair whose order differs from the paper's,
the paragraph on why, the report's detail tables and figures."""

from __future__ import annotations

import datetime
import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from common.hparams import ConfigError
from common.storage.persist import atomic_write_text
from common.storage.run_folder import RunFolder
from experiments.analysis.claims import claim_lines
from experiments.analysis.collect import Group, Run, find_runs, group_runs
from experiments.analysis.figures import SKIPPED, figures_available
from experiments.analysis.reports import (
    corruption_table,
    domain_table,
    overview,
    paired_table,
    shift_table,
    stage_table,
    unseen_table,
)
from experiments.analysis.stats import few_seeds_note, fmt_ci, mean_ci, paired_difference
from experiments.analysis.tables import (
    FLOPS,
    ROUNDS,
    Column,
    TableSpec,
    best_companion,
    find_row,
    paper_column,
    row_experiment,
    row_values,
)
from experiments.run.cpu_share import CpuShare
from experiments.run.runs import RunSpec, run_commits, run_state
from experiments.run.sweep import document_sweep

SETTING_KEYS = (
    "dataset",
    "model",
    "partition",
    "dirichlet-alpha",
    "max-samples",
    "num-rounds",
    "fraction-train",
    "local-epochs",
    "batch-size",
    "optimizer",
    "lr",
)


def _values(groups: list[Group], spec: TableSpec, row: str, column: Column) -> dict[int, float]:
    """seed -> the row's value in the column."""
    return row_values(groups, spec, row, column.metric)


def _fmt(values: dict[int, float], column: Column) -> str:
    if column.metric in ROUNDS:
        shown = (f"{values[seed]:g}" if math.isfinite(values[seed]) else "n/a" for seed in sorted(values))
        return ", ".join(shown) or "n/a"
    mean, half, _ = mean_ci(list(values.values()))
    if column.percent:
        return fmt_ci(mean, half)
    if column.metric in FLOPS:
        return f"{mean:.3e}" if math.isfinite(mean) else "n/a"
    return f"{mean:.3f}" if math.isfinite(mean) else "n/a"


def _paper(value: float, column: Column) -> str:
    if not math.isfinite(value):
        return "-"
    if column.metric in ROUNDS:
        return f"{value:g}"
    return f"{value:.2f}" if column.percent else f"{value:.3f}"


PAPER_STATISTIC = {"last": ", last round", "best": ", best round", "unknown": ""}


def beside_paper(groups: list[Group], spec: TableSpec) -> list[str]:
    """Ours (mean +/- 95% CI over seeds) after the last round and, for every accuracy column, at the best round,
    then the paper's number (labelled with the round it is from, where the paper says), a line per row."""
    with_paper = [any(math.isfinite(v[i]) for v in spec.paper.values()) for i in range(len(spec.columns))]
    header = ["row", "seeds"]
    for column, paper in zip(spec.columns, with_paper):
        twin = best_companion(column, spec)
        header.append(f"{column.label}{', last round' if twin else ''}{' (ours)' if paper else ''}")
        if twin:
            header.append(f"{twin.label}{' (ours)' if paper else ''}")
        if paper:
            header.append(f"{column.label} (paper{PAPER_STATISTIC[spec.paper_statistic]})")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in spec.rows:
        found = find_row(groups, row)
        cells = [row, _seeds_cell(found[0]) if found else "not run yet"]
        for index, (column, paper) in enumerate(zip(spec.columns, with_paper)):
            for shown in filter(None, (column, best_companion(column, spec))):
                cells.append(_fmt(_values(groups, spec, row, shown), shown) if found else "")
            if paper:
                cells.append(_paper(spec.paper.get(row, (math.nan,) * len(spec.columns))[index], column))
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def statistic_line(spec: TableSpec) -> str:
    """What the table's two statistics are, and which one its paper comparisons use."""
    which = {
        "best": "the paper reports the best round, so its order and claims are compared at our best round",
        "last": "the paper reports the last round, so its order and claims are compared at our last round",
        "unknown": "the paper does not say which round it reports: its order and claims are compared at our last round",
    }[spec.paper_statistic]
    best = (
        "best round: the mean over clients at the evaluation round with the best mean accuracy without shift (each "
        "seed its own round)"
        if spec.best_round_columns
        else "a column of a quantity's best round: that quantity's highest mean over the evaluation rounds (each "
        "quantity and seed its own round)"
    )
    return f"Last round: the mean over clients after the run's last evaluation; {best}; {which}."


def _seeds_cell(group: Group) -> str:
    """A row's seeds: their count, and how many are stale when any is."""
    stale = group.stale
    return f"{len(group.runs)} (**{stale} stale**)" if stale else str(len(group.runs))


@dataclass(frozen=True)
class OrderCheck:
    """The paper's order against ours in one table: pairs compared, those that differ (text) and how many of
    those differ beyond the seeds' noise."""

    compared: int
    differing: list[str]
    significant: int


def order_check(groups: list[Group], spec: TableSpec) -> OrderCheck:
    """Every pair of rows and column where the paper has A above B and our mean has B above A; 'significant'
    where the paired 95% interval over shared seeds excludes zero."""
    out: list[str] = []
    compared = significant = 0
    for index, column in enumerate(paper_column(spec, c) for c in spec.columns):
        ranked = [
            (r, spec.paper[r][index]) for r in spec.rows if r in spec.paper and math.isfinite(spec.paper[r][index])
        ]
        for a, paper_a in ranked:
            for b, paper_b in ranked:
                if not paper_a > paper_b:
                    continue
                ours_a, ours_b = _values(groups, spec, a, column), _values(groups, spec, b, column)
                diff, half, n = paired_difference(ours_a, ours_b)
                if n == 0:
                    continue
                compared += 1
                if not diff < 0:
                    continue
                scale = 100.0 if column.percent else 1.0
                beyond = math.isfinite(half) and diff + half < 0
                significant += beyond
                sure = "significant" if beyond else "within the seeds' noise"
                out.append(
                    f"- {column.label}: paper {a} {_paper(paper_a, column)} > {b} {_paper(paper_b, column)}; "
                    f"ours {_fmt(ours_a, column)} vs {_fmt(ours_b, column)}, paired difference "
                    f"{fmt_ci(diff, half, scale, 2 if column.percent else 3)} (n={n}, {sure})"
                )
    return OrderCheck(compared, out, significant)


def order_lines(check: OrderCheck, spec: TableSpec) -> list[str]:
    """The order check as markdown."""
    if not check.compared:
        return ["No two rows with the paper's numbers have finished on shared seeds yet.", ""] if spec.paper else []
    if not check.differing:
        return [
            f"All {check.compared} ordered pairs (row, row, column) with the paper's numbers are in the paper's "
            "order here.",
            "",
        ]
    return (
        [
            f"Where the paper's order does not hold here ({len(check.differing)} of the {check.compared} ordered "
            f"pairs with the paper's numbers, {check.significant} beyond the seeds' noise; paper A > B, ours A < B):",
            "",
        ]
        + check.differing
        + [""]
    )


def _setting(groups: list[Group], spec: TableSpec) -> str:
    """The settings the table's runs share, read from their configs."""
    configs = [g.config for g in groups]
    shared = [
        f"{k} {configs[0][k]}"
        for k in SETTING_KEYS
        if k in configs[0] and all(c.get(k) == configs[0][k] for c in configs)
    ]
    clients = {int(g.runs[0].summary.get("num_clients", 0)) for g in groups}
    seeds = sorted({r.seed for g in groups for r in g.runs})
    seconds = sum(float(r.summary.get("wall_seconds", 0.0)) for g in groups for r in g.runs)
    spent = f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"
    return (
        f"Runs: {', '.join(shared)}; clients {', '.join(map(str, sorted(clients)))}; seeds {seeds}; "
        f"{sum(len(g.runs) for g in groups)} runs, {spent} of run time summed over the runs; "
        f"{machine_share([r.cpu for g in groups for r in g.runs])}."
    )


def machine_share(shares: list[CpuShare | None]) -> str:
    """How much of the machine a table's runs had, in words: how many ran alone, how many beside other work (and
    how many cores that took on average), how many were not measured."""
    measured = [s for s in shares if s is not None and s.others_cores is not None]
    alone = sum(s.alone for s in measured)
    beside = [s for s in measured if not s.alone]
    parts = [f"{alone} ran alone on the machine"] if alone else []
    if beside:
        together = sum(beside[1:], beside[0])  # CpuShare's sum: seconds added, as a resumed run's attempts
        cores = together.others_cores or 0.0
        parts.append(f"{len(beside)} beside other work that kept {cores:.1f} cores busy on average")
    if unmeasured := len(shares) - len(measured):
        parts.append(f"{unmeasured} unmeasured (runs of sweep shards side by side share the cores)")
    return ", ".join(parts) if parts else "none measured"


def section(groups: list[Group], spec: TableSpec, check: OrderCheck, figures_dir: Path, doc_dir: Path) -> list[str]:
    """The markdown of one table: setting, ours beside the paper, order differences, notes, detail, figures."""
    from experiments.analysis.figures import draw_all

    lines = [f"## {spec.title}", ""]
    if spec.setting:
        lines += [spec.setting, ""]
    used = [g for g in groups if any((f := find_row([g], r)) and f[0] is g for r in spec.rows)]
    if not used:
        return lines + ["No run of this table has finished yet.", ""]
    lines += [_setting(used, spec), ""]
    if spec.source:
        lines += [f"Paper: {spec.source}.", ""]
    lines += beside_paper(used, spec) + [statistic_line(spec), ""] + order_lines(check, spec)
    if spec.notes:
        missing = [row for row in spec.rows if not find_row(used, row)]
        if missing:  # a note quotes the whole table's numbers: say which of its rows this document lacks
            lines += [
                f"(The note below was written for the whole table; its rows {', '.join(f'`{r}`' for r in missing)} "
                "are not in this document: left out by `--only`, or without a finished run.)",
                "",
            ]
        lines += [spec.notes, ""]
    found_base = find_row(used, spec.baseline) if spec.baseline else None
    base = found_base[0] if found_base else None
    makers = {
        "overview": lambda: overview(used, base),
        "paired": lambda: paired_table(used, base),
        "shift": lambda: shift_table(used),
        "unseen": lambda: unseen_table(used),
        "corruption": lambda: corruption_table(used),
        "domain": lambda: domain_table(used),
        "stages": lambda: stage_table(used),
    }
    detail = [line for name in spec.sections for line in makers[name]()]
    if detail:
        lines += ["<details><summary>Detail</summary>", ""] + detail + ["</details>", ""]
    if spec.figures:
        out = figures_dir / spec.id
        out.mkdir(parents=True, exist_ok=True)
        rounds = [found[0] for row in spec.round_rows if (found := find_row(used, row))]
        shift_rows = [(found[0], found[1], row) for row in spec.rows if (found := find_row(used, row))]
        drawn = draw_all(used, base, out, only=spec.figures, round_groups=rounds or None, shift_rows=shift_rows)
        for name in drawn:
            lines.append(f"![{spec.id}: {name}]({os.path.relpath(out / name, doc_dir)})")
        lines.append("")
    return lines


def _machine() -> str:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, {gpu}, Python "
        f"{platform.python_version()}, torch {torch.__version__}"
    )


def shown_path(path: str | Path) -> str:
    """A path as a committed document may show it: relative to the working folder (the repository), or, outside it,
    only its last part behind an ellipsis: never the absolute path of the machine that wrote the document."""
    given = Path(path).expanduser()
    if not given.is_absolute():
        return given.as_posix()
    try:
        return given.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return f"…/{given.name}"


def finished_runs(
    specs: list[RunSpec], runs_dir: Path | None, recorded: dict[str, Run] | None = None
) -> dict[str, Run]:
    """run name -> the finished run of each spec: its record's when it has one, else its run folder's under runs_dir
    (a run folder without a record is taken as current: its behaviour is not checked)."""
    recorded = recorded or {}
    found: dict[str, Run] = {}
    folders = [runs_dir / s.name for s in specs if s.name not in recorded and runs_dir is not None]
    loaded = (
        {run.path.name: run for run in find_runs(done, required=False)}
        if (done := [f for f in folders if _done(f)])
        else {}
    )
    for spec in specs:
        run = recorded.get(spec.name) or loaded.get(spec.name)
        if run is not None:
            found[spec.name] = run
    return found


def _done(run_dir: Path) -> bool:
    return run_state(run_dir) == "finished"


def _mark_rows(groups: list[Group]) -> None:
    """Label each group whose runs are not all current: 'name' stays the row's name, the seeds cell says it."""
    for group in groups:
        group.stale = sum(not r.current for r in group.runs)


def write_results(
    sweep_file: Path,
    runs_dir: Path | None,
    out: Path,
    command: str | None = None,
    only: str | None = None,
    recorded: dict[str, Run] | None = None,
) -> tuple[Path, int, int]:
    """The results document for a sweep file's tables over its finished runs: the records in `recorded` (run name ->
    run, with whether it is current), else the run folders in runs_dir (`only`: narrowed to those experiments, as
    `pflower sweep --only`); figures beside it in figures/; returns (path, finished runs, runs in the sweep). Tables
    show every finished run with its row's stale seeds counted; verdicts and order checks use current runs only."""
    sweep = document_sweep(sweep_file, only)
    specs, tables = sweep.specs, sweep.tables
    only_flag = f" --only '{only}'" if only else ""
    resume = f"pflower sweep {sweep_file}{only_flag}"
    runs = finished_runs(specs, runs_dir, recorded)
    if not runs:
        where = f" under {runs_dir}" if runs_dir is not None else ""
        raise ConfigError(f"no finished run or current record of {sweep_file}{where}: run `{resume}` first")
    groups = group_runs(list(runs.values()))
    _mark_rows(groups)
    current = [r for r in runs.values() if r.current]
    current_groups = group_runs(current) if current else []
    stale = len(runs) - len(current)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = command or f"pflower results {shown_path(sweep_file)}"
    lines = [
        f"# {sweep.title}",
        "",
        f"Generated by `{command}` from {len(runs)} of {len(specs)} runs of `{shown_path(sweep_file)}`"
        + (
            f" ({len(current)} current, {stale} stale: made by code that has changed what they do since)"
            if stale
            else ""
        )
        + f"; the newest finished on {_newest(list(runs.values()))}.",
        f"Runs made on: {_machines(list(runs.values()))}.",
        code_line(list(runs.values())),
        "",
    ]
    if len(runs) < len(specs):
        lines += [
            f"**Incomplete:** {len(specs) - len(runs)} runs have not finished; "
            f"`pflower sweep {shown_path(sweep_file)}{only_flag}` makes them (`pflower results --check` lists them "
            "with their hours).",
            "",
        ]
    if stale:
        lines += [
            f"**Stale:** {stale} runs were made by code that has changed what their settings do since (their "
            "behaviour hash differs). Their rows say how many seeds are current; verdicts and order checks use "
            "current runs only; `pflower sweep` makes the stale runs again.",
            "",
        ]
    lines += [
        "Accuracies are means over clients of the last evaluation, then mean +/- 95% t-interval over seeds. "
        "The order check compares every two rows of a column where the paper gives both numbers.",
        "",
    ]
    lines += few_seeds_note({g.label: len(g.runs) for g in current_groups})
    if not figures_available():
        lines += [f"({SKIPPED[0].upper()}{SKIPPED[1:]}.)", ""]
    lines += claim_lines(current_groups, tables, sweep.claims)
    checks = [order_check(current_groups, table) for table in tables]
    lines += overview_table(tables, checks, specs, runs)
    for table, check in zip(tables, checks):
        lines += section(groups, table, check, out.parent / "figures", out.parent)
    atomic_write_text(out, "\n".join(lines) + "\n")
    return out.resolve(), len(runs), len(specs)


def _newest(runs: list[Run]) -> str:
    """The date the newest of the runs finished (its summary's time)."""
    stamps = []
    for run in runs:
        path = RunFolder(run.path).summary_path
        stamp = run.finished or (
            datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC).isoformat() if path.is_file() else ""
        )
        stamps.append(stamp[:10])
    return max(stamps) if any(stamps) else "an unrecorded date"


def _machines(runs: list[Run]) -> str:
    """The machines the runs were made on, each with its count (a run folder's: this machine)."""
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.machine or _machine()] = counts.get(run.machine or _machine(), 0) + 1
    return "; ".join(f"{m} ({n} run{'s' if n != 1 else ''})" for m, n in counts.items())


def code_line(runs: list[Run] | list[Path]) -> str:
    """Which code made the runs: each commit with its count of runs (a run resumed under another commit counts
    under each), and how many recorded none."""
    counts: dict[str, int] = {}
    unrecorded = 0
    for run in runs:
        commits = run_commits(run) if isinstance(run, Path) else (run.commits or run_commits(run.path))
        unrecorded += not commits
        for commit in commits:
            counts[commit] = counts.get(commit, 0) + 1
    parts = [f"{commit} ({n} run{'s' if n != 1 else ''})" for commit, n in counts.items()]
    if unrecorded:
        parts.append(f"not recorded ({unrecorded} run{'s' if unrecorded != 1 else ''})")
    return "Code that made the runs (app commit; '+changes': uncommitted edits of the code): " + ", ".join(parts) + "."


def overview_table(
    tables: list[TableSpec], checks: list[OrderCheck], specs: list[RunSpec], runs: dict[str, Run]
) -> list[str]:
    """One line per table: runs finished, pairs compared with the paper's order, those that differ."""
    rows = []
    for table, check in zip(tables, checks):
        names = {row_experiment(r) for r in table.rows}
        mine = [s for s in specs if s.experiment in names]
        done = sum(s.name in runs for s in mine)
        rows.append(
            f"| [{table.title}](#{_anchor(table.title)}) | {done} / {len(mine)} | {check.compared} | "
            f"{len(check.differing)} | {check.significant} |"
        )
    return (
        [
            "| table | runs finished | ordered pairs compared with the paper | order differs | of which beyond "
            "the seeds' noise |",
            "|---|---|---|---|---|",
        ]
        + rows
        + [""]
    )


def _anchor(title: str) -> str:
    """GitHub's heading anchor."""
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")
