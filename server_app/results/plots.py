"""The run's figures: accuracy by round and by shift degree (and by corruption severity)."""

from __future__ import annotations

from logging import WARNING
from pathlib import Path

from flwr.supercore import log

from common.learning.evaluate import shift_key
from common.storage.run_folder import RoundRecord, Summary, evaluation, evaluation_means, final_means, final_stds

from .shift import plot_corruptions


def plot_run(records: list[RoundRecord], summary: Summary, run_dir: Path) -> None:
    """accuracy_vs_round.png, accuracy_vs_shift.png and, with corruptions, accuracy_vs_corruption.png; skipped with
    one warning line where matplotlib is not installed (a base install): the run itself is complete without them."""
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
    fig, ax = plt.subplots(figsize=(7.5, 4), layout="constrained")
    rounds = [rnd for rnd, _ in evaluated]
    for d in degrees:
        ax.plot(rounds, [100 * mean[shift_key(d)] for _, mean in evaluated], marker=".", label=f"shift {100 * d:g}%")
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("mean client accuracy (%)")
    ax.set_title(f"{summary.get('algorithm')} on {summary.get('dataset')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # beside the axes, never on a curve
    fig.savefig(run_dir / "accuracy_vs_round.png", dpi=120)
    plt.close(fig)

    final_mean, final_std = final_means(summary), final_stds(summary)
    fig, ax = plt.subplots(figsize=(6, 4))
    means = [100 * final_mean[shift_key(d)] for d in degrees]
    stds = [100 * final_std[shift_key(d)] for d in degrees]
    ax.errorbar([100 * d for d in degrees], means, yerr=stds, marker="o", capsize=3)
    ax.set_xlabel("test-time shift degree (%)")
    ax.set_ylabel("accuracy (%), mean +/- std over clients")
    ax.set_title(f"{summary.get('algorithm')}: accuracy under shift (round {summary.get('final_round')})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(run_dir / "accuracy_vs_shift.png", dpi=120)
    plt.close(fig)
    plot_corruptions(summary, run_dir)
