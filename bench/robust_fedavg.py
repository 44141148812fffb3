"""FedAvg under model-replacement attack on MNIST Dir(0.3): no defence, norm clipping, trimmed mean and median,
against the clean run.

The same experiments as a sweep: bench/sweeps/robust_fedavg.toml (PFL_DATA_DIR=... pflower sweep
bench/sweeps/robust_fedavg.toml; pflower report results/robust_fedavg --baseline clean-none).

20 clients, all of them every round; 2 of them (seeded, run-config attack-clients = 0.1) train on labels shifted by
one class, upload w + 10 (w_local - w) (attack-boost = 10: the averaged update becomes about the attackers' one) and
declare 100,000 training samples, the most max-client-samples allows (attack-declare: to outweigh the others). Every
run caps each client's weight at 4 times the median declared count (max-weight-ratio = 4, as the deployment recipes
set it). Every mode runs without and with the attackers: `none` (the sample-weighted average), `clip` (updates longer
than the round's median update norm shortened to it, counts capped at the round's median), `trimmed-mean` (20% of each
coordinate's values, at least one, dropped at each end), `median`. CPU preset: 10 rounds of 1 local epoch (batch 64,
SGD lr 0.05), evaluation after the last round. The table gives the final mean +/- std client accuracy (no shift), what
the attackers cost against the same mode without them, and the server's median aggregation time per round, from each
run's summary.json.

With --colluders the attackers are 3 of 20 that train on shifted labels and send their update reversed
(attack-boost = -1), at their true counts: every upload is as long as an honest one, inside the honest spread. The
`peer` mode is the sample-weighted average with each update at most 3 times the median norm of the round's other
updates (max-update-ratio = 3, as the DM-PFL recipes set it).

    python bench/robust_fedavg.py [--colluders] [--data-dir ../shared/data] [--rounds 10]
Further flags go to bench/compare.py.
"""

from __future__ import annotations

import sys

from common.storage.run_folder import final_means, final_stds
from experiments.benchmarks.compare import compare_args, main

REPLACEMENT = "attack-clients=0.1 attack-boost=10 attack-declare=100000"
COLLUDERS = "attack-clients=0.15 attack-boost=-1"  # 3 of 20 send their own update reversed: inside the honest spread
ATTACK = COLLUDERS if "--colluders" in sys.argv else REPLACEMENT
ATTACKERS = "3 colluders" if ATTACK == COLLUDERS else "2 attackers"
DEPLOYMENT = "max-weight-ratio=4"  # what the deployment recipes set
MODES = {  # name: (title, run-config overrides)
    "none": ("no defence", "robust-aggregation='none'"),
    "peer": ("peer bound (max-update-ratio 3)", "robust-aggregation='none' max-update-ratio=3"),
    "clip": ("norm clipping", "robust-aggregation='clip'"),
    "trimmed-mean": ("trimmed mean (20%)", "robust-aggregation='trimmed-mean'"),
    "median": ("median", "robust-aggregation='median'"),
}
RUNS = {  # name: (title, run-config overrides); per mode, without and with the attackers
    f"{who}-{mode}": (
        f"{ATTACKERS if who == 'attack' else 'no attacker'}, {title}",
        " ".join(filter(None, [ATTACK if who == "attack" else "", overrides, DEPLOYMENT])),
    )
    for mode, (title, overrides) in MODES.items()
    for who in ("clean", "attack")
}
DEFAULTS = compare_args(
    algorithms=",".join(f"{name}:fedavg[{extra}]" if extra else f"{name}:fedavg" for name, (_, extra) in RUNS.items()),
    dataset="mnist",
    partition="dirichlet",
    alpha=0.3,
    clients=20,
    rounds=10,
    fraction=1.0,
    epochs=1,
    batch_size=64,
    lr=0.05,
    eval_every=10,
)


def robust_table(summaries: dict[str, dict]) -> str:
    """Markdown: one row per run, final accuracy without shift, the attackers' cost, updates clipped, aggregation
    time."""
    lines = [
        "| run | accuracy (%, mean +/- std over clients) | cost of the attackers (points) | updates clipped "
        "| aggregation per round (ms) |",
        "|---|---|---|---|---|",
    ]
    for name, (title, _) in RUNS.items():
        s = summaries.get(name)
        if s is None:
            continue
        acc = 100 * final_means(s)["acc-shift-0"]
        clean = summaries.get(name.replace("attack-", "clean-", 1)) if name.startswith("attack-") else None
        cost = f"{100 * final_means(clean)['acc-shift-0'] - acc:.2f}" if clean else "-"
        robust = s.get("robust") or {}
        bounded = s.get("peer_bound") or {}
        clipped = str(robust["clipped"]) if robust.get("method") == "clip" else str(bounded.get("clipped", "-"))
        lines.append(
            f"| {title} | {acc:.2f} +/- {100 * final_stds(s)['acc-shift-0']:.2f} | {cost} | {clipped} "
            f"| {1e3 * s['aggregate_s_median']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    results = main(DEFAULTS + [arg for arg in sys.argv[1:] if arg != "--colluders"])
    print("\nFinal mean client accuracy (no shift) and the server's aggregation cost:")
    print(robust_table(results))
