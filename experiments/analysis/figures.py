"""The report's figures: accuracy vs shift, per corruption and severity, costs, the cost frontier, FedAMP's
attention and DM-PFL's mask overlap between clients."""

from __future__ import annotations

import math
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np

from common.learning.evaluate import shift_key
from common.plotting import accuracy_label, accuracy_limits
from common.storage.run_folder import evaluation, evaluation_means
from experiments.analysis.collect import Group, corruptions_of, settings_text
from experiments.analysis.stats import mean_ci

PANELS_PER_ROW = 5
SKIPPED = "figures skipped: matplotlib is not installed (pip install 'pflower[reports]')"


def figures_available() -> bool:
    """Whether matplotlib can be imported (a base install has none: reports are written without figures)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _seed_mean(group: Group, value: Any) -> tuple[float, float]:
    """Mean and std across seeds of value(run)."""
    values = [v for v in group.by_seed(value).values()]
    if not values:
        return float("nan"), float("nan")
    return float(np.mean(values)), float(np.std(values)) if len(values) > 1 else 0.0


def seed_interval(group: Group, value: Any) -> tuple[float, float]:
    """Mean over seeds of value(run) and the half-width of its 95% t-interval: the statistic the report's tables
    give beside each number (NaN half-width, so no bar, below 2 seeds)."""
    mean, half, _ = mean_ci(list(group.by_seed(value).values()))
    return mean, half


def setting_title(groups: list[Group]) -> str:
    """The data set and setting the groups share, in the report's words: 'digits, dirichlet, 6 clients, 2 rounds'."""
    keys = [
        key
        for key in ("dataset", "partition", "clients", "num-rounds")
        if groups[0].settings.get(key) is not None and len({str(g.settings.get(key)) for g in groups}) == 1
    ]
    return settings_text(groups[0].settings, keys)


def _panels(
    plt: Any, count: int, width: float, height: float, sharey: bool = False, layout: str = "tight"
) -> tuple[Any, list[Any]]:
    """A figure of `count` panels in rows of at most PANELS_PER_ROW (a single row of ten is unreadable once the
    page scales it down); the unused cells of the last row are hidden."""
    cols = min(count, PANELS_PER_ROW)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(width * cols, height * rows), squeeze=False, sharey=sharey, layout=layout
    )
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def dodged(x: list[float], index: int, count: int, width: float = 0.5) -> list[float]:
    """Series `index` of `count` shifted along x around each point, within `width` of the smallest gap between the
    points, so that no series' error bars sit on another's."""
    gaps = [b - a for a, b in zip(x, x[1:]) if b > a]
    step = (min(gaps) if gaps else 1.0) * width / max(count, 1)
    return [v + (index - (count - 1) / 2) * step for v in x]


def differs(a: list[float], b: list[float], tolerance: float = 1e-9) -> bool:
    """Whether two series differ anywhere both are numbers."""
    return any(abs(u - v) > tolerance for u, v in zip(a, b) if math.isfinite(u) and math.isfinite(v))


def accuracy_vs_shift(groups: list[Group], out: Path, rows: list[tuple[Group, str, str]] | None = None) -> str:
    """Last-round (solid) accuracy by shift degree, and the best round's (dashed) where it differs from the last;
    bars: the 95% interval over seeds of the shift table; the series dodged within each degree's slot, so that every
    bar shows and the axis holds only the degrees.

    rows: (group, metric prefix, label) of each line, e.g. a table's DM-PFL+ row (prefix 'plus-'); default: each
    group's main model."""
    plt = pyplot()
    series = rows if rows is not None else [(g, "", g.label) for g in groups]
    degrees = [float(d) for d in series[0][0].runs[0].summary.get("shift_degrees", [0.0])]
    fig, ax = plt.subplots(figsize=(9, 4.5), layout="constrained")
    slots = [float(i) for i in range(len(degrees))]  # the degrees as categories: dodging never leaves 0..100%
    drawn: list[float] = []
    for index, (g, prefix, label) in enumerate(series):
        color = f"C{index % 10}"
        keys = [prefix + shift_key(d) for d in degrees]
        lasts = [seed_interval(g, lambda r, k=k: r.final.get(k)) for k in keys]
        last, half = [100 * m for m, _ in lasts], [100 * h for _, h in lasts]
        best = [100 * seed_interval(g, lambda r, k=k: r.best_round().get(k))[0] for k in keys]
        at = dodged(slots, index, len(series))
        ax.errorbar(at, last, yerr=half, color=color, marker="o", capsize=3, label=f"{label} (last)")
        drawn += [m + sign * h for m, h in zip(last, half) if math.isfinite(h) for sign in (-1, 1)] + last
        if differs(best, last):
            ax.plot(at, best, color=color, linestyle="--", marker="x", alpha=0.7, label=f"{label} (best round)")
            drawn += best
    ax.set_xticks(slots, [f"{100 * d:g}%" for d in degrees])
    ax.set_xlim(-0.5, len(degrees) - 0.5)
    limits = accuracy_limits(drawn)
    ax.set_ylim(*limits)
    ax.set_xlabel("test-time shift degree")
    ax.set_ylabel(accuracy_label(limits, "mean over seeds"))
    ax.set_title(
        f"Accuracy under test-time shift: {setting_title([g for g, _, _ in series])}\n"
        "(bars: 95% interval over seeds, as in the table; dashed: best round, where not the last)",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    order = {
        f"{label} ({kind})": 2 * i + j
        for i, (_, _, label) in enumerate(series)
        for j, kind in enumerate(("last", "best round"))
    }
    shown = sorted(zip(handles, labels), key=lambda item: order[item[1]])  # each experiment's two lines together
    ax.legend(*zip(*shown), fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # beside the axes
    fig.savefig(out / "accuracy_vs_shift.png", dpi=120)
    plt.close(fig)
    return "accuracy_vs_shift.png"


def corruption_figure(groups: list[Group], found: dict[str, list[int]], out: Path) -> str | None:
    """One panel per experiment: accuracy by severity (0 = clean), a line per corruption."""
    if not found:
        return None
    plt = pyplot()
    fig, axes = _panels(plt, len(groups), 4.2, 4, sharey=True, layout="constrained")
    drawn: list[float] = []
    for ax, g in zip(axes, groups):
        clean = _seed_mean(g, lambda r: r.final.get(shift_key(0.0)))[0]
        for name, severities in found.items():
            values = [_seed_mean(g, lambda r, k=f"acc-corrupt-{name}-{s}": r.final.get(k))[0] for s in severities]
            drawn += [100 * v for v in [clean, *values]]
            ax.plot([0, *severities], [100 * clean] + [100 * v for v in values], marker=".", label=name)
        ax.set_title(g.label, fontsize=9)
        ax.set_xlabel("severity")
        ax.grid(alpha=0.3)
    limits = accuracy_limits(drawn)
    axes[0].set_ylim(*limits)
    for ax in axes[::PANELS_PER_ROW]:
        ax.set_ylabel(accuracy_label(limits, "mean over seeds"))
    handles, labels = axes[-1].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="outside right center")
    fig.suptitle(f"Accuracy by corruption and severity: {setting_title(groups)}", fontsize=10)
    fig.savefig(out / "corruptions.png", dpi=120)
    plt.close(fig)
    return "corruptions.png"


def _scaled(values: list[float]) -> tuple[list[float], str]:
    """Values divided by a power of 1000 that keeps them below 1000, and the factor as text ('' for none): the scale
    goes into the axis label instead of matplotlib's offset text, which collides with the title."""
    top = max((abs(v) for v in values if math.isfinite(v)), default=0.0)
    power = int(math.floor(math.log10(top) / 3)) * 3 if top >= 1000 else 0
    return [v / 10**power for v in values], (f" (x 1e{power})" if power else "")


def costs_figure(groups: list[Group], base: Group | None, out: Path) -> str:
    """MB and training FLOPs per client, bars labelled with their ratio to the baseline."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 1.4 * len(groups) + 4), 4.5), layout="constrained")
    for ax, value, title, unit in (
        (axes[0], attrgetter("mb_per_client"), "MB per client\n(train, down + up)", "MB"),
        (axes[1], attrgetter("flops_per_client"), "training FLOPs per client", "FLOPs"),
    ):
        means = [_seed_mean(g, value)[0] for g in groups]
        shown, scale = _scaled(means)
        bars = ax.bar(range(len(groups)), shown, color=[f"C{i % 10}" for i in range(len(groups))])
        reference = _seed_mean(base, value)[0] if base else float("nan")
        for bar, mean in zip(bars, means):
            if reference and math.isfinite(reference):
                ax.annotate(
                    f"{mean / reference:.2f}x",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
        ax.margins(y=0.12)  # room for the ratio above the tallest bar
        ax.set_xticks(range(len(groups)), [g.label for g in groups], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(unit + scale)
        ax.set_title(title, fontsize=9)
    ratios = f"; ratios over the bars: to {base.label}" if base else ""
    fig.suptitle(f"Costs per client: {setting_title(groups)}{ratios}", fontsize=9)
    fig.savefig(out / "costs.png", dpi=120)
    plt.close(fig)
    return "costs.png"


def minimum_span(values: list[float], relative: float = 0.05, absolute: float = 1e-3) -> tuple[float, float] | None:
    """Axis limits around values nearly equal (their span below `relative` of their size, or `absolute`): centred,
    that wide, so that a difference of a few bytes is not spread across the axis; None when they spread enough."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    low, high = min(finite), max(finite)
    wanted = max(relative * max(abs(low), abs(high)), absolute)
    if high - low >= wanted:
        return None
    centre = (low + high) / 2
    return centre - wanted / 2 - 0.1 * wanted, centre + wanted / 2 + 0.1 * wanted


def plain_axes(ax: Any, x: list[float]) -> None:
    """Tick labels as plain numbers (no offset such as '1e-6+6.15368'), x limits at least minimum_span wide."""
    ax.ticklabel_format(axis="both", style="plain", useOffset=False)
    limits = minimum_span(x)
    if limits is not None:
        ax.set_xlim(*limits)


def frontier_figure(groups: list[Group], out: Path) -> str:
    """Accuracy against MB per client, the Pareto frontier (more accuracy for fewer bytes) drawn through where it
    joins two experiments or more; bars: the 95% interval over seeds of the tables."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.5, 4.5), layout="constrained")
    points, drawn = [], []
    for index, g in enumerate(groups):
        mb = _seed_mean(g, attrgetter("mb_per_client"))[0]
        acc, half = seed_interval(g, lambda r: r.final.get(shift_key(0.0)))
        points.append((mb, acc))
        drawn += [100 * acc] + ([100 * (acc - half), 100 * (acc + half)] if math.isfinite(half) else [])
        ax.errorbar([mb], [100 * acc], yerr=[100 * half], marker="o", color=f"C{index % 10}", capsize=3, label=g.label)
    frontier, best = [], -math.inf
    for mb, acc in sorted(points):
        if acc > best:
            frontier.append((mb, acc))
            best = acc
    if len(frontier) > 1:  # a frontier of one point is no line: no legend entry for it
        ax.plot([p[0] for p in frontier], [100 * p[1] for p in frontier], "k:", alpha=0.6, label="Pareto frontier")
    plain_axes(ax, [p[0] for p in points])
    limits = accuracy_limits(drawn)
    ax.set_ylim(*limits)
    ax.set_xlabel("MB per client (train, down + up, measured)")
    ax.set_ylabel(accuracy_label(limits, "no shift, mean over seeds"))
    ax.set_title(
        f"Cost frontier: {setting_title(groups)}\n(bars: 95% interval over seeds, as in the table)", fontsize=10
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.savefig(out / "frontier.png", dpi=120)
    plt.close(fig)
    return "frontier.png"


def privacy_figure(rows: list[tuple[Group, str, str]], out: Path) -> str | None:
    """Accuracy against the epsilon each run reached (log scale), without shift and at the largest shift degree: a
    line per algorithm (and evaluation row, e.g. DM-PFL+), its runs without DP drawn at 'no DP' on the right."""
    points: dict[str, list[tuple[float, Group, str]]] = {}
    for group, prefix, label in rows:
        series = group.algorithm + label[len(group.label) :]  # 'dmpfl+' for the row 'mnist-dmpfl-eps4+'
        private = group.config.get("dp", "none") != "none"
        eps = _seed_mean(group, lambda r: (r.summary.get("dp") or {}).get("epsilon", math.nan))[0] if private else 0.0
        points.setdefault(series, []).append((eps, group, prefix))
    reached = [e for found in points.values() for e, _, _ in found if e > 0 and math.isfinite(e)]
    if not reached:
        return None
    plt = pyplot()
    no_dp = max(reached) * 4  # where the runs without DP sit
    degrees = [float(d) for d in rows[0][0].runs[0].summary.get("shift_degrees", [0.0])]
    shifts = sorted({degrees[0], degrees[-1]})
    fig, axes = _panels(plt, len(shifts), 5.2, 4.2, sharey=True, layout="constrained")
    drawn: list[float] = []
    for ax, degree in zip(axes, shifts):
        for index, (series, found) in enumerate(points.items()):
            found = sorted(found, key=lambda p: no_dp if p[0] == 0 else p[0])
            xs = [no_dp if e == 0 else e for e, _, _ in found]
            key = shift_key(degree)
            values = [seed_interval(g, lambda r, k=prefix + key: r.final.get(k)) for _, g, prefix in found]
            drawn += [100 * (m + sign * h) for m, h in values for sign in (-1, 0, 1) if math.isfinite(h) or not sign]
            ax.errorbar(
                xs,
                [100 * v[0] for v in values],
                yerr=[100 * v[1] for v in values],
                marker="o",
                capsize=3,
                color=f"C{index % 10}",
                label=series,
            )
        ticks = sorted(set(reached)) + [no_dp]
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{t:.3g}" for t in ticks[:-1]] + ["no DP"])
        ax.minorticks_off()
        ax.set_xlabel("epsilon reached (delta 1e-5 unless set)")
        ax.set_title(f"test-time shift {100 * degree:g}%", fontsize=9)
        ax.grid(alpha=0.3)
    limits = accuracy_limits(drawn)
    axes[0].set_ylim(*limits)
    axes[0].set_ylabel(accuracy_label(limits, "mean over seeds"))
    axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(
        f"Accuracy against the privacy budget: {setting_title([g for g, _, _ in rows])}\n"
        "(bars: 95% interval over seeds, as in the table)",
        fontsize=10,
    )
    fig.savefig(out / "privacy.png", dpi=120)
    plt.close(fig)
    return "privacy.png"


def matrix_figure(
    groups: list[Group], key: str, title: str, name: str, out: Path, off_diagonal: bool = False
) -> str | None:
    """A clients x clients matrix an algorithm saved (first seed of each experiment that has one) as a heatmap;
    `off_diagonal`: the diagonal left blank (its median in the title), so the rest keeps a readable scale."""
    found = [(g, g.runs[0].artifacts()) for g in groups]
    found = [(g, a) for g, a in found if key in a]
    if not found:
        return None
    plt = pyplot()
    fig, axes = _panels(plt, len(found), 4.6, 4)
    for ax, (g, arrays) in zip(axes, found):
        matrix = np.array(arrays[key], dtype=np.float64)
        label = f"{g.label} (seed {g.runs[0].seed})"
        if off_diagonal:
            label += f", diagonal median {np.median(np.diag(matrix)):.2f}"
            np.fill_diagonal(matrix, np.nan)
        scale = {} if off_diagonal else {"vmin": 0.0, "vmax": 1.0}  # off the diagonal: the values' own range
        image = ax.imshow(matrix, cmap="viridis", **scale)
        ax.set_title(label, fontsize=8)
        clients = [int(c) for c in arrays.get(f"{key}_clients", np.zeros(0))]
        readable = 0 < len(clients) <= 20
        if readable:  # partition ids on the axes where they stay readable, else row numbers
            ax.set_xticks(range(len(clients)), [str(c) for c in clients], fontsize=7)
            ax.set_yticks(range(len(clients)), [str(c) for c in clients], fontsize=7)
        ax.set_xlabel("client j" + (" (partition id)" if readable else " (row)"))
        ax.set_ylabel("client i" + (" (partition id)" if readable else " (row)"))
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.suptitle(f"{title}\n{setting_title([g for g, _ in found])}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / name, dpi=120)
    plt.close(fig)
    return name


GLOBAL_KEY = "global-acc-shift-0"  # a personalized method's global model, where it evaluates one


def global_per_round(groups: list[Group], out: Path) -> str:
    """The global model's accuracy without shift at every evaluated round, mean over seeds (band: min to max): an
    algorithm's `global-acc-shift-0` where it reports one (DM-PFL's theta_g), else its accuracy (FedAvg, FedDST)."""
    if not groups:
        return ""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    drawn: list[float] = []
    for index, group in enumerate(groups):
        evaluated = [(r["round"], evaluation_means(r)) for run in group.runs for r in run.records if evaluation(r)]
        key = GLOBAL_KEY if any(GLOBAL_KEY in mean for _, mean in evaluated) else "acc-shift-0"
        by_round: dict[int, list[float]] = {}
        for rnd, mean in evaluated:
            if key in mean:
                by_round.setdefault(int(rnd), []).append(100.0 * float(mean[key]))
        rounds = sorted(by_round)
        values = [by_round[r] for r in rounds]
        drawn += [v for vs in values for v in vs]
        label = f"{group.label} ({'global model' if key == GLOBAL_KEY else 'its model'})"
        ax.plot(rounds, [np.mean(v) for v in values], color=f"C{index % 10}", label=label)
        if any(len(v) > 1 for v in values):
            low, high = [min(v) for v in values], [max(v) for v in values]
            ax.fill_between(rounds, low, high, color=f"C{index % 10}", alpha=0.2)
    ax.set_xlabel("round")
    limits = accuracy_limits(drawn)
    ax.set_ylim(*limits)
    ax.set_ylabel(accuracy_label(limits, "no shift, mean over clients"))
    ax.set_title(
        f"Global models' accuracy per round: {setting_title(groups)}\n(line: mean over seeds; band: min to max)",
        fontsize=10,
    )
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="lower right")
    fig.savefig(out / "global_per_round.png", dpi=120)
    plt.close(fig)
    return "global_per_round.png"


def draw_all(
    groups: list[Group],
    base: Group | None,
    out: Path,
    only: tuple[str, ...] | None = None,
    round_groups: list[Group] | None = None,
    shift_rows: list[tuple[Group, str, str]] | None = None,
) -> list[str]:
    """Every figure that applies to these runs (or those named in `only`; `round_groups`: the groups of the
    global-rounds figure, default all; `shift_rows`: the lines of the shift figure, default each group's main
    model); returns their file names (none without matplotlib: see SKIPPED)."""
    if not figures_available():
        return []
    makers = {
        "shift": lambda: accuracy_vs_shift(groups, out, shift_rows),
        "corruption": lambda: corruption_figure(groups, corruptions_of(groups), out),
        "costs": lambda: costs_figure(groups, base, out),
        "frontier": lambda: frontier_figure(groups, out),
        "attention": lambda: matrix_figure(
            groups,
            "attention",
            "FedAMP: attention xi_ij to other clients, last round",
            "attention.png",
            out,
            off_diagonal=True,
        ),
        "mask-overlap": lambda: matrix_figure(
            groups, "mask_overlap", "DM-PFL: mask overlap (IoU),\nlast phase-1 round's uploads", "mask_overlap.png", out
        ),
        "global-rounds": lambda: global_per_round(groups if round_groups is None else round_groups, out),
        "privacy": lambda: privacy_figure(shift_rows or [(g, "", g.label) for g in groups], out),
    }
    on_request = ("global-rounds", "privacy")
    wanted = [name for name in makers if name not in on_request] if only is None else only
    names = [maker() for name, maker in makers.items() if name in wanted]
    return [n for n in names if n]
