"""`pflower report`: one markdown file and PNG figures over run folders, seeds pooled into mean +/- 95% CI."""

from __future__ import annotations

import math
from collections.abc import Callable
from operator import attrgetter
from pathlib import Path
from typing import Any

from common.algorithms import FINETUNED, SPECS
from common.hparams import ConfigError
from common.learning.evaluate import shift_key
from common.storage.persist import atomic_write_text
from common.storage.run_folder import unseen_evaluation, unseen_means
from experiments.analysis.collect import (
    Group,
    Run,
    by_settings,
    corruptions_of,
    distinguishing_keys,
    find_runs,
    group_runs,
    settings_text,
)
from experiments.analysis.stats import few_seeds_note, fmt_ci, mean_ci, paired_difference

Value = Callable[[Run], Any]
_MB, _FLOPS = attrgetter("mb_per_client"), attrgetter("flops_per_client")


def _degrees(groups: list[Group]) -> list[float]:
    return [float(d) for d in groups[0].runs[0].summary.get("shift_degrees", [0.0])]


def _pct(groups: list[Group]) -> str:
    return f"{100 * _degrees(groups)[-1]:g}%"


def _cell(group: Group, value: Value, scale: float = 100.0, digits: int = 2) -> str:
    mean, half, _ = mean_ci(list(group.by_seed(value).values()))
    return fmt_ci(mean, half, scale, digits)


def _mean(group: Group, value: Value) -> float:
    return mean_ci(list(group.by_seed(value).values()))[0]


def baseline_of(groups: list[Group], name: str | None) -> Group | None:
    """The group the others are compared with: the named one, else the first FedAvg one, else none."""
    if name:
        for group in groups:
            if group.label == name:
                return group
        raise ConfigError(f"--baseline {name!r} is none of the experiments: {', '.join(g.label for g in groups)}")
    return next((g for g in groups if g.algorithm == "fedavg"), None)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _final(key: str) -> Value:
    return lambda run: run.final.get(key)


def overview(groups: list[Group], base: Group | None) -> list[str]:
    """Accuracy (last and best round, no shift and full shift), client spread, MB and FLOPs with ratios."""
    top = shift_key(_degrees(groups)[-1])
    rows = []
    for g in groups:
        mb, flops = _mean(g, _MB), _mean(g, _FLOPS)
        ratio_mb = _mean(base, _MB) if base else float("nan")
        ratio_fl = _mean(base, _FLOPS) if base else float("nan")
        rows.append(
            [
                g.label,
                g.algorithm,
                str(len(g.runs)),
                _cell(g, _final(shift_key(0.0))),
                _cell(g, lambda r: r.best_round().get(shift_key(0.0))),
                _cell(g, _final(top)),
                _cell(g, lambda r: r.final_std.get(shift_key(0.0))),
                f"{mb:.3f}",
                f"{mb / ratio_mb:.2f}x" if base and ratio_mb else "n/a",
                f"{flops:.3e}",
                f"{flops / ratio_fl:.2f}x" if base and ratio_fl else "n/a",
            ]
        )
        for row in SPECS[g.algorithm].eval_rows if g.algorithm in SPECS else ():
            if not row.diagnostic and any(row.prefix + shift_key(0.0) in r.final for r in g.runs):
                rows.append(
                    [
                        g.label + row.suffix,
                        g.algorithm,
                        str(len(g.runs)),
                        _cell(g, _final(row.prefix + shift_key(0.0))),
                        "",
                        _cell(g, _final(row.prefix + top)),
                        "",
                        "",
                        "",
                        "",
                        "",
                    ]
                )
    base_name = base.label if base else "none"
    return (
        [
            f"Accuracy (%) after the last round, mean over seeds +/- 95% CI; best round = the evaluation round with "
            f"the highest mean accuracy; client std = spread across clients (mean over seeds); MB = training traffic "
            f"per client (down + up, measured); ratios to `{base_name}`.",
            "",
        ]
        + _table(
            [
                "experiment",
                "algorithm",
                "seeds",
                "accuracy",
                "best-round accuracy",
                f"accuracy at shift {_pct(groups)}",
                "client std",
                "MB / client",
                "x base",
                "train FLOPs / client",
                "x base",
            ],
            rows,
        )
        + [""]
    )


def shift_table(groups: list[Group]) -> list[str]:
    """Accuracy at every shift degree, last round."""
    degrees = _degrees(groups)
    rows = [[g.label] + [_cell(g, _final(shift_key(d))) for d in degrees] for g in groups]
    return (
        ["Accuracy (%) by test-time shift degree (last round, mean over seeds +/- 95% CI):", ""]
        + _table(["experiment"] + [f"{100 * d:g}%" for d in degrees], rows)
        + [""]
    )


def paired_table(groups: list[Group], base: Group | None) -> list[str]:
    """Differences to the baseline on the same seeds (accuracy without shift and at full shift)."""
    if base is None or len(groups) < 2:
        return []
    top = shift_key(_degrees(groups)[-1])
    rows = []
    for g in groups:
        if g is base:
            continue
        cells = []
        for key in (shift_key(0.0), top):
            mean, half, n = paired_difference(g.by_seed(_final(key)), base.by_seed(_final(key)))
            cells.append(f"{fmt_ci(mean, half)} (n={n})")
        rows.append([g.label] + cells)
    return (
        [f"Paired difference to `{base.label}` on the seeds both ran (percentage points, mean +/- 95% CI):", ""]
        + _table(["experiment", "accuracy", f"accuracy at shift {_pct(groups)}"], rows)
        + [""]
    )


def unseen_table(groups: list[Group]) -> list[str]:
    """Held-out clients: the newcomer model as received and after fine-tuning (no shift)."""

    def unseen(key: str) -> Value:
        return lambda run: unseen_means(run.summary).get(key)

    rows = [
        [g.label, _cell(g, unseen(shift_key(0.0))), _cell(g, unseen(FINETUNED.prefix + shift_key(0.0)))]
        for g in groups
        if any(unseen_evaluation(r.summary) for r in g.runs)
    ]
    if not rows:
        return []
    return (
        ["Held-out clients (never trained; `holdout-clients`): accuracy (%) of the model a newcomer receives:", ""]
        + _table(["experiment", "as received", "after fine-tuning"], rows)
        + [""]
    )


def corruption_table(groups: list[Group]) -> list[str]:
    """Accuracy per corruption (mean over its severities) and per severity (mean over corruptions)."""
    found = corruptions_of(groups)
    if not found:
        return []
    severities = sorted({s for sev in found.values() for s in sev})

    def average(keys: list[str]) -> Value:
        def value(run: Run) -> float:
            got = [run.final[k] for k in keys if k in run.final]
            return sum(got) / len(got) if got else float("nan")

        return value

    rows = [
        [g.label, _cell(g, _final(shift_key(0.0)))]
        + [_cell(g, average([f"acc-corrupt-{c}-{s}" for s in found[c]])) for c in found]
        + [_cell(g, average([f"acc-corrupt-{c}-{s}" for c in found if s in found[c]])) for s in severities]
        for g in groups
    ]
    return (
        [
            "Corruption shift: accuracy (%) on each client's corrupted test split, per corruption (mean over "
            "severities) and per severity (mean over corruptions):",
            "",
        ]
        + _table(["experiment", "clean"] + list(found) + [f"severity {s}" for s in severities], rows)
        + [""]
    )


def domain_table(groups: list[Group]) -> list[str]:
    """Domain shift: accuracy on the client's own domain and on the domains it never trained on."""
    keys = ("acc-seen-domain", "acc-unseen-domains")
    rows = [[g.label] + [_cell(g, _final(k)) for k in keys] for g in groups if any(keys[1] in r.final for r in g.runs)]
    if not rows:
        return []
    return (
        [
            "Domain shift: accuracy (%) on held-out data of the client's own domain and of the domains it never "
            "trained on:",
            "",
        ]
        + _table(["experiment", "seen domain", "unseen domains"], rows)
        + [""]
    )


def stage_table(groups: list[Group]) -> list[str]:
    """FLIU's stages (G, L1, L2): Acc(L), Acc(G) and Acc, mean over seeds."""
    rows = []
    for g in groups:
        staged = [r for r in g.runs if r.summary.get("stages")]
        for stage in staged[0].summary["stages"] if staged else {}:

            def acc(key: str, stage: str = stage) -> Value:
                return lambda run: ((run.summary.get("stages") or {}).get(stage, {}).get(key) or [math.nan])[0]

            rows.append([g.label, stage] + [_cell(g, acc(k)) for k in ("acc_local", "acc_global", "acc")])
    if not rows:
        return []
    return (
        ["FLIU stages (`stages=true`): Acc(L) on the client's test split, Acc(G) on the pooled test set (%):", ""]
        + _table(["experiment", "stage", "Acc(L)", "Acc(G)", "Acc"], rows)
        + [""]
    )


def _section(groups: list[Group], base: Group | None) -> list[str]:
    """Every table over one settings group's experiments."""
    lines: list[str] = []
    for part in (
        overview(groups, base),
        paired_table(groups, base),
        shift_table(groups),
        unseen_table(groups),
        corruption_table(groups),
        domain_table(groups),
        stage_table(groups),
    ):
        lines.extend(part)
    return lines


def left_out_lines(setting_groups: list[list[Group]], keys: list[str]) -> list[str]:
    """One line per run in a settings group of a single experiment: nothing ran beside it to compare with."""
    lines = []
    for members in setting_groups:
        if len(members) == 1:
            group = members[0]
            where = f" ({settings_text(group.settings, keys)})" if keys else ""
            for run in group.runs:
                lines.append(f"- {run.path.name}{where}: no other algorithm ran this setting")
    if not lines:
        return []
    return ["Left out of every comparison:", ""] + lines + [""]


def write_report(paths: list[Path], out: Path | None = None, baseline: str | None = None) -> Path:
    """report.md and the figures for the runs under `paths`; returns the markdown file's path.

    Runs are compared only with runs of the same settings (`experiment_settings`: everything but the algorithm and
    its own keys, seed, names, folders and engine keys): one section per settings group, each with its own baseline
    and figures."""
    from experiments.analysis.figures import SKIPPED, draw_all, figures_available

    groups = group_runs(find_runs(paths))
    baseline_of(groups, baseline)  # a --baseline naming no experiment is refused before anything is written
    setting_groups = by_settings(groups)
    keys = distinguishing_keys(setting_groups)
    out = Path(out) if out else Path(paths[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)
    settings = ", ".join(
        f"{g.label}: {g.config.get('dataset')} / {g.config.get('partition')} / seeds {sorted(r.seed for r in g.runs)}"
        for g in groups
    )
    lines = ["# Report", "", f"{sum(len(g.runs) for g in groups)} runs in {len(groups)} experiments ({settings}).", ""]
    lines += few_seeds_note({g.label: len(g.runs) for g in groups})
    if not figures_available():
        lines += [f"({SKIPPED[0].upper()}{SKIPPED[1:]}.)", ""]
    if len(setting_groups) > 1:
        lines += [
            f"The runs hold {len(setting_groups)} settings (they differ in {', '.join(keys)}); experiments are "
            "compared only with those of the same settings.",
            "",
        ]
    lines += left_out_lines(setting_groups, keys)
    for index, members in enumerate(setting_groups, 1):
        named = next((g for g in members if g.label == baseline), None) if baseline else None
        base = named or baseline_of(members, None)
        folder = f"settings{index}" if len(setting_groups) > 1 else ""  # each group's figures in its own folder
        if len(setting_groups) > 1:
            lines += [f"## Settings {index}: {settings_text(members[0].settings, keys)}", ""]
        lines += _section(members, base)
        (out / folder).mkdir(exist_ok=True)
        names = [f"{folder}/{name}" if folder else name for name in draw_all(members, base, out / folder)]
        lines.extend(f"![{name}]({name})" for name in names)
        lines.append("")
    path = out / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path.resolve()
