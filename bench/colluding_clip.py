"""Colluders steering central DP's adaptive clip bound (run-config dp-adaptive-clip), with and without the band
(dp-clip-band) that keeps the bound within a factor of dp-clip-norm.

Andrew et al. 2021's bound moves geometrically toward the target quantile of the update norms, from a noised count
of the updates under it. k colluders of n can report every update above the bound (norm 1e6: the bound is pushed
up) or below it (norm 0: pushed down). With target quantile q and f = k/n, the honest updates settle the bound at
their (q - f) / (1 - f) quantile (down) or q / (1 - f) quantile (up); past f = q (down) or f = 1 - q (up) that quantile
does not exist and the bound moves without end, except for the band.

The rounds run the real code: server_app's CentralDp.aggregate on one-coordinate "models" whose update norms are the
round's norms (honest: log-normal around dp-clip-norm, sigma 0.3; the count's noise as a run with noise multiplier 1
and 10 clients a round draws it). Seeded; prints a markdown table of the bound after the last round (as a multiple
of dp-clip-norm) and writes a figure.

    python bench/colluding_clip.py [--rounds 120] [--clients 10] [--band 10] [--out docs/figures/robustness]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
from scipy.stats import norm

from common.methods.privacy import AdaptiveClip, CentralDp
from experiments.analysis.figures import pyplot

SIGMA = 0.3  # spread of the honest update norms (log-normal, median = dp-clip-norm = 1)
PUSH = {"up": 1e6, "down": 0.0}  # a colluder's update norm: always above, or always under, the bound


def trajectory(clients: int, colluders: int, push: str, band: float, rounds: int, seed: int) -> list[float]:
    """The clip bound before each round and after the last, starting at 1 (= dp-clip-norm)."""
    adaptive = AdaptiveClip(0.5, 0.2, 0.0, 1.0 / band, band)
    dp = CentralDp(1.0, 0.0, 1e-5, clients, clients, rounds, seed, adaptive)
    rng = np.random.default_rng(seed)
    reference = [np.zeros(1, np.float32)]
    bound, bounds = 1.0, [1.0]
    for index in range(rounds):
        norms = [*np.exp(rng.normal(0.0, SIGMA, clients - colluders)), *[PUSH[push]] * colluders]
        models = [[np.array([n], np.float32)] for n in norms]
        _, report = dp.aggregate(models, reference, index, bound)
        bound = float(report["next_clip_bound"])
        bounds.append(bound)
    return bounds


def settled(fraction: float, push: str, quantile: float = 0.5) -> float:
    """Where the bound settles (a multiple of the honest median) with a `fraction` of colluders, no band: the honest
    norms' quantile (q - f) / (1 - f) (down) or q / (1 - f) (up); infinity or 0 when that quantile does not exist."""
    target = (quantile - fraction) / (1 - fraction) if push == "down" else quantile / (1 - fraction)
    if target >= 1:
        return math.inf
    if target <= 0:
        return 0.0
    return float(np.exp(SIGMA * norm.ppf(target)))


def main() -> None:
    """The table and the figure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--band", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("docs/figures/robustness"))
    args = parser.parse_args()
    n = args.clients
    print(f"clip bound after {args.rounds} rounds, a multiple of dp-clip-norm (target quantile 0.5, {n} a round)")
    print("| colluders | push | settles at (theory, no band) | no band | band x" + f"{args.band:g} |")
    print("|---|---|---|---|---|")
    runs = {}
    for k in range(0, n // 2 + 2):
        for push in ("up", "down"):
            if k == 0 and push == "down":
                continue
            free = trajectory(n, k, push, math.inf, args.rounds, args.seed)
            banded = trajectory(n, k, push, args.band, args.rounds, args.seed)
            runs[(k, push)] = (free, banded)
            theory = settled(k / n, push)
            print(f"| {k} of {n} | {push if k else '-'} | {theory:.3g} | {free[-1]:.3g} | {banded[-1]:.3g} |")
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, push in zip(axes, ("up", "down"), strict=True):
        for k in (0, 3, n // 2 + 1):
            free, banded = runs[(k, "up" if k == 0 else push)]
            line = ax.plot(free, label=f"{k} colluders, no band")[0]
            ax.plot(banded, ls="--", color=line.get_color(), label=f"{k} colluders, band x{args.band:g}")
        ax.set(yscale="log", xlabel="round", title=f"colluders push the bound {push}")
        ax.axhline(args.band, color="grey", lw=0.5)
        ax.axhline(1 / args.band, color="grey", lw=0.5)
    axes[0].set_ylabel("clip bound / dp-clip-norm")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "colluding-clip.png"
    fig.savefig(path, dpi=110)
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
