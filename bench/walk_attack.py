"""The walk attack: one client of ten that uploads, every round, the model it received plus half its own update's
length along one fixed direction (run-config attack-walk = 0.5, attack-clients = 0.1), a step every per-round bound
lets through, against HeurFedAMP, FedAMP and FedAvg with the recipes' per-round bound (max-update-ratio = 3), at a
constant learning rate and with lr-decay 0.97 a round (the per-round bound follows the honest updates, which shrink
with the learning rate, so the walk's total is bounded there).

Measured per round (the round records' `walk`): how far along that direction the honest clients' cloud models u_i
lie (median; FedAMP and HeurFedAMP) or the global model lies (FedAvg), from where they were after round 1; and the
final accuracy of the honest clients (the walker's own is left out: it trains on shifted labels). Digits, 10 clients,
all every round, 100 rounds of 2 local epochs, one seed; each algorithm also runs without the walker (24 runs).

    python bench/walk_attack.py [--rounds 100] [--out docs/figures/robustness]
Further flags go to bench/compare.py.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from common.data.noise import seeded_client_ids
from common.seeding import derive_seed
from common.storage.run_folder import RunFolder, evaluation
from experiments.analysis.figures import pyplot
from experiments.benchmarks.compare import compare_args, main

WALK = "attack-clients=0.1 attack-walk=0.5"
BOUND = "max-update-ratio=3"  # the recipes' per-round bound, in every run
ALGORITHMS = ("heurfedamp", "fedamp", "fedavg")
RUNS = {
    f"{alg}-{who}": (alg, f"{WALK} {BOUND}" if who == "walk" else BOUND)
    for alg in ALGORITHMS
    for who in ("clean", "walk")
}
CLIENTS = 10
SEED = 0


def walk_series(run_dir: Path) -> list[float]:
    """The `walk` projection of every round (honest clouds' median, or the global model), minus round 1's."""
    values = []
    for record in RunFolder(run_dir).rounds():
        walk = record.get("walk") or {}
        if walk:
            values.append(float(walk["honest_cloud"] if "honest_cloud" in walk else walk["global"]))
    return [v - values[0] for v in values] if values else []


def honest_accuracy(run_dir: Path) -> float:
    """The last evaluation's mean accuracy (no shift) over the clients that do not walk."""
    walkers = seeded_client_ids(CLIENTS, 0.1, derive_seed(SEED, "attackers"))
    evaluations = [found for record in RunFolder(run_dir).rounds() if (found := evaluation(record))]
    last = evaluations[-1]["per_client"]
    return statistics.fmean(v["acc-shift-0"] for pid, v in last.items() if int(pid) not in walkers)


SETTINGS = {"constant lr": "", "lr-decay 0.97": "lr-decay=0.97"}


def run_setting(rounds: int, title: str, overrides: str, extra: list[str]) -> Path:
    """The six runs of one learning-rate setting; their compare folder."""
    spec = ",".join(
        f"{name}:{alg}[{' '.join(filter(None, (config, overrides)))}]" for name, (alg, config) in RUNS.items()
    )
    argv = compare_args(
        algorithms=spec,
        dataset="digits",
        clients=CLIENTS,
        rounds=rounds,
        fraction=1.0,
        epochs=2,
        eval_every=rounds,
        seed=SEED,
    )
    results = Path("results/walk_attack") / title.replace(" ", "-")
    print(f"\n{title}", flush=True)
    main([*argv, "--results-dir", str(results), *extra])
    return max(results.glob("compare-*"), key=lambda p: p.stat().st_mtime)


def run(rounds: int, out: Path, extra: list[str]) -> None:
    """Run both settings, print the table, draw the figure (a panel per setting)."""
    folders = {title: run_setting(rounds, title, overrides, extra) for title, overrides in SETTINGS.items()}
    print(f"\nwalk after {rounds} rounds (projection on the walkers' direction, from round 1) and honest accuracy")
    print("| setting | algorithm | walk, one walker | honest accuracy, no walker (%) | one walker (%) |")
    print("|---|---|---|---|---|")
    plt = pyplot()
    fig, axes = plt.subplots(1, len(folders), figsize=(11, 3.8), sharey=True)
    for ax, (title, folder) in zip(axes, folders.items(), strict=True):
        for alg in ALGORITHMS:
            clean, walked = folder / f"{alg}-clean", folder / f"{alg}-walk"
            series = walk_series(walked)
            print(
                f"| {title} | {alg} | {series[-1]:+.2f} | {100 * honest_accuracy(clean):.2f} "
                f"| {100 * honest_accuracy(walked):.2f} |"
            )
            ax.plot(range(1, len(series) + 1), series, label=alg)
        ax.set(xlabel="round", title=f"one walker of 10, max-update-ratio 3, {title}")
    axes[0].set_ylabel("projection on the walk direction")
    axes[0].legend()
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "walk.png", dpi=110)
    print(f"figure: {out / 'walk.png'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("docs/figures/robustness"))
    known, rest = parser.parse_known_args()
    run(known.rounds, known.out, rest)
