"""The run's figures: accuracy by round and by shift degree (and by corruption severity)."""

from __future__ import annotations

from logging import WARNING
from pathlib import Path

from flwr.supercore import log

from common.algorithms import eval_rows
from common.learning.evaluate import shift_key
from common.plotting import accuracy_label, accuracy_limits
from common.storage.run_folder import RoundRecord, Summary, evaluation, evaluation_means, final_means, final_stds

from .shift import plot_corruptions


def run_models(summary: Summary) -> list[tuple[str, str]]:
    """(metric prefix, label) of every model the run's final evaluation reports: its main model, then each of the
    algorithm's accuracy rows (DM-PFL: theta_c, DM-PFL+ and its selector variants, theta_g); diagnostic rows (shares
    of samples) are no models."""
    means = final_means(summary)
    main = "theta_c" if summary.get("algorithm") == "dmpfl" else "main model"
    rows = [(row.prefix, row.label) for row in eval_rows() if not row.diagnostic]
    return [("", main)] + [(prefix, label) for prefix, label in rows if prefix + shift_key(0.0) in means]


def run_title(summary: Summary) -> str:
    """The algorithm, data set and setting of the run, e.g. 'dmpfl on digits (dirichlet, 6 clients, seed 0)'."""
    setting = [str(summary[k]) for k in ("partition",) if summary.get(k)]
    setting += [f"{summary['num_clients']} clients" if summary.get("num_clients") else ""]
    setting += [f"seed {summary['seed']}" if summary.get("seed") is not None else ""]
    return f"{summary.get('algorithm')} on {summary.get('dataset')} ({', '.join(s for s in setting if s)})"


def plot_run(records: list[RoundRecord], summary: Summary, run_dir: Path) -> None:
    """accuracy_vs_round.png, accuracy_vs_shift.png and, with corruptions, accuracy_vs_corruption.png; skipped with
    one warning line where matplotlib is not installed (a base install): the run itself is complete without them.
    Every model the run reports is drawn (a panel each by round, a line each by shift); accuracy axes start at a
    floor their label states."""
    try:
        import matplotlib
    except ImportError:
        log(WARNING, "figures skipped: matplotlib is not installed (pip install 'pflower[reports]')")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    evaluated = [(r["round"], evaluation_means(r)) for r in records if evaluation(r)]
    if not evaluated:
        return
    degrees = summary.get("shift_degrees", [])
    models = run_models(summary)
    rounds = [rnd for rnd, _ in evaluated]
    curves = {
        (prefix, d): [100 * mean.get(prefix + shift_key(d), float("nan")) for _, mean in evaluated]
        for prefix, _ in models
        for d in degrees
    }
    limits = accuracy_limits(v for curve in curves.values() for v in curve)
    cols = min(len(models), 3)  # a row of five panels is unreadable once a page scales it down
    rows_of_panels = -(-len(models) // cols)
    fig, grid = plt.subplots(
        rows_of_panels,
        cols,
        figsize=(3.8 * cols + 2.2, 3.4 * rows_of_panels + 0.5),
        layout="constrained",
        sharey=True,
        squeeze=False,
    )
    axes = [ax for row in grid for ax in row]
    for ax in axes[len(models) :]:
        ax.set_visible(False)
    for ax, (prefix, label) in zip(axes, models):
        for d in degrees:
            ax.plot(rounds, curves[(prefix, d)], marker=".", label=f"shift {100 * d:g}%")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(*limits)
        ax.grid(alpha=0.3)
    for row in grid:
        row[0].set_ylabel(accuracy_label(limits, "mean over clients"), fontsize=8)
    axes[cols - 1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # beside the axes, not on a curve
    fig.suptitle(run_title(summary), fontsize=10)
    fig.savefig(run_dir / "accuracy_vs_round.png", dpi=120)
    plt.close(fig)

    final_mean, final_std = final_means(summary), final_stds(summary)
    fig, ax = plt.subplots(figsize=(7.5, 4), layout="constrained")
    slots = list(range(len(degrees)))  # the degrees as categories: the models side by side within each
    drawn: list[float] = []
    for index, (prefix, label) in enumerate(models):
        means = [100 * final_mean.get(prefix + shift_key(d), float("nan")) for d in degrees]
        stds = [100 * final_std.get(prefix + shift_key(d), float("nan")) for d in degrees]
        drawn += [m + sign * s for m, s in zip(means, stds) for sign in (-1, 1)]
        at = [x + (index - (len(models) - 1) / 2) * 0.5 / len(models) for x in slots]
        ax.errorbar(at, means, yerr=stds, marker="o", capsize=3, label=label)
    limits = accuracy_limits(drawn)
    ax.set_xticks(slots, [f"{100 * d:g}%" for d in degrees])
    ax.set_xlim(-0.5, len(degrees) - 0.5)
    ax.set_ylim(*limits)
    ax.set_xlabel("test-time shift degree")
    ax.set_ylabel(accuracy_label(limits, "mean +/- std over clients"))
    ax.set_title(f"{run_title(summary)}:\naccuracy under shift, round {summary.get('final_round')}", fontsize=10)
    ax.grid(alpha=0.3)
    if len(models) > 1:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.savefig(run_dir / "accuracy_vs_shift.png", dpi=120)
    plt.close(fig)
    plot_corruptions(summary, run_dir)
