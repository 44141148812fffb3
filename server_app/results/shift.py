"""summary.md's corruption and domain shift tables and the accuracy-vs-severity figure, from the final evaluation's
mean and std across clients."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from common.data.corruptions import CORRUPTIONS
from common.data.domains import DOMAINS
from common.learning.evaluate import SEEN_DOMAIN_KEY, UNSEEN_DOMAINS_KEY, domain_accuracy_key, shift_key
from common.plotting import accuracy_label, accuracy_limits
from common.storage.run_folder import FinalEvaluation, Summary, final_evaluation, final_means, final_stds

_CORRUPT_KEY = re.compile(r"acc-corrupt-(.+)-([1-5])")
Cell = tuple[float, float]  # mean, std across clients


def corruption_table(final: FinalEvaluation | None) -> dict[str, dict[int, Cell]]:
    """Accuracy (mean, std) by corruption and severity, from an evaluation's `acc-corrupt-<name>-<severity>` keys;
    corruptions in the registry's order."""
    table: dict[str, dict[int, Cell]] = {}
    means, std = (final["mean"], final["std"]) if final else ({}, {})
    for key, mean in means.items():
        match = _CORRUPT_KEY.fullmatch(key)
        if match:
            table.setdefault(match[1], {})[int(match[2])] = (mean, std.get(key, float("nan")))
    order = {name: i for i, name in enumerate(CORRUPTIONS)}
    return {name: dict(sorted(table[name].items())) for name in sorted(table, key=lambda n: (order.get(n, 99), n))}


def _cell(cell: Cell | None) -> str:
    if cell is None or cell[0] != cell[0]:
        return "n/a"
    return f"{100 * cell[0]:.2f} +/- {100 * cell[1]:.2f}"


def corruption_lines(summary: Summary) -> list[str]:
    """The accuracy table by corruption (rows) and severity (columns) of the final evaluation; empty without one."""
    final = final_evaluation(summary)
    table = corruption_table(final)
    if not table or not final:
        return []
    severities = sorted({s for row in table.values() for s in row})
    clean = shift_key(0.0)
    lines = [
        f"Corruption shift (CIFAR-10-C style) after round {summary.get('final_round')}: accuracy (%) on each "
        "client's corrupted test split, mean +/- std across clients, by severity."
    ]
    if clean in final["mean"]:
        lines[0] += f" Clean: {_cell((final['mean'][clean], final['std'][clean]))}."
    lines += [
        "",
        "| corruption | " + " | ".join(f"severity {s}" for s in severities) + " | mean |",
        "|---|" + "---|" * (len(severities) + 1),
    ]
    for name, row in table.items():
        means = [row[s][0] for s in severities if s in row]
        average = sum(means) / len(means) if means else float("nan")
        lines.append(
            f"| {name} | "
            + " | ".join(_cell(row.get(s)) for s in severities)
            + f" | {'n/a' if average != average else f'{100 * average:.2f}'} |"
        )
    return lines + [""]


def domain_shift_lines(summary: Summary) -> list[str]:
    """The evaluated model on the domain each client trained on, on the others (mean), and on every domain."""
    mean, std = final_means(summary), final_stds(summary)
    if SEEN_DOMAIN_KEY not in mean:
        return []
    names = [n for n in DOMAINS if domain_accuracy_key(n) in mean]
    keys = [SEEN_DOMAIN_KEY, UNSEEN_DOMAINS_KEY] + [domain_accuracy_key(n) for n in names]
    return [
        "Domain shift: each client's evaluated model (its personalized one where the algorithm has one) on the "
        "held-out test data of the domain it trained on (seen), of the domains it never trained on (unseen, "
        "mean over them) and of each domain (%, mean +/- std across clients):",
        "",
        "| seen domain | unseen domains | " + " | ".join(names) + " |",
        "|---" * len(keys) + "|",
        "| " + " | ".join(_cell((mean[k], std.get(k, float("nan")))) if k in mean else "n/a" for k in keys) + " |",
        "",
    ]


def plot_corruptions(summary: Summary, run_dir: Path) -> None:
    """accuracy_vs_corruption.png: mean accuracy vs severity, one line per corruption (severity 0: clean)."""
    final = final_evaluation(summary)
    table = corruption_table(final)
    if not table or not final:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clean = final["mean"].get(shift_key(0.0))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = plt.get_cmap("tab20")  # 10 dark hues first, then their light pairs
    markers = "osD^v<>ph*Xd"
    for i, (name, row) in enumerate(table.items()):
        xs = ([0] if clean is not None else []) + list(row)
        ys = ([100 * clean] if clean is not None else []) + [100 * cell[0] for cell in row.values()]
        ax.plot(
            xs,
            ys,
            marker=markers[i % len(markers)],
            color=colors((2 * i) % 20 + (i // 10) % 2),
            label=name.replace("_", " "),
        )
    ax.set_xticks(range(0 if clean is not None else 1, 6))
    ax.set_xticklabels((["clean"] if clean is not None else []) + [str(s) for s in range(1, 6)])
    ax.set_xlabel("corruption severity")
    limits = accuracy_limits(float(y) for line in ax.get_lines() for y in np.asarray(line.get_ydata(), float))
    ax.set_ylim(*limits)
    ax.set_ylabel(accuracy_label(limits, "mean over clients"))
    ax.set_title(
        f"{summary.get('algorithm')} on {summary.get('dataset')}: corrupted test data "
        f"(round {summary.get('final_round')})"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(run_dir / "accuracy_vs_corruption.png", dpi=120)
    plt.close(fig)
