"""Run several algorithms on one federated setting and print accuracy at every shift degree, costs and time
(bench/compare.py and the benchmarks built on it).

The same experiments (the default flags) as a sweep: bench/sweeps/compare.toml (PFL_DATA_DIR=... pflower sweep
bench/sweeps/compare.toml; pflower report results/compare).

Each algorithm runs on the chosen engine (`--engine`: the in-process engine by default, or `flwr run` on a private
local SuperLink) with the same seed, data, partition and rounds; the table is read from each run's summary.json.

    python bench/compare.py --algorithms fedavg,local --dataset mnist --data-dir ../shared/data \\
        --clients 100 --rounds 30 --fraction 0.1 --epochs 5 --batch-size 64 --lr 0.05 --eval-every 5


Paper: Hussaini, Theiss, Stein, "Local Performance vs. Out-of-Distribution Generalization: An Empirical Analysis of
Personalized Federated Learning in Heterogeneous Data Environments", arXiv:2510.24503."""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from common.algorithms import eval_rows
from common.storage.run_folder import RunFolder, Summary, final_means, final_stds
from experiments.run.launchers import ENGINES, make_engine

REPO = Path(__file__).resolve().parents[2]  # the checkout: experiments/benchmarks/compare.py
SHARED_DATA = REPO.parent / "shared" / "data"  # the staged data sets beside a checkout


def compare_args(**options: str | int | float) -> list[str]:
    """This command's arguments from keyword options (`batch_size=64` -> `--batch-size 64`), reading the data from
    ../shared/data beside the checkout unless `data_dir` says otherwise: the benchmarks' default flags."""
    options = {"data_dir": str(SHARED_DATA), **options}
    return [item for key, value in options.items() for item in (f"--{key.replace('_', '-')}", str(value))]


def _pct(mean: float, std: float) -> str:
    return "n/a" if math.isnan(mean) else f"{100 * mean:.2f} +/- {100 * std:.2f}"


VARIANTS = {row.prefix: row.suffix for row in eval_rows() if not row.diagnostic}  # extra accuracies some report


def accuracy_table(summaries: dict[str, Summary]) -> str:
    """Markdown: one row per algorithm (and per variant it reports), accuracy mean +/- std per shift degree."""
    degrees = next(iter(summaries.values()))["shift_degrees"]
    lines = [
        "| algorithm | " + " | ".join(f"shift {100 * d:g}%" for d in degrees) + " | best mean (no shift) |",
        "|---|" + "---|" * (len(degrees) + 1),
    ]
    for name, s in summaries.items():
        mean, std = final_means(s), final_stds(s)
        for prefix, suffix in [("", ""), *VARIANTS.items()]:
            if f"{prefix}acc-shift-{degrees[0]:g}" not in mean:
                continue
            cells = [_pct(mean[f"{prefix}acc-shift-{d:g}"], std[f"{prefix}acc-shift-{d:g}"]) for d in degrees]
            best = f"{100 * s['best_mean_accuracy']:.2f}" if prefix == "" else ""
            lines.append(f"| {name}{suffix} | " + " | ".join(cells) + f" | {best} |")
    return "\n".join(lines)


def stage_table(summaries: dict[str, Summary]) -> str:
    """Markdown like the FLIU paper's Table I: Acc(L), Acc(G), Acc at stages L1, L2 and Acc(G) at G (%), plus a '+' row
    for DM-PFL+'s stages L1+ and L2+; '' if none."""
    with_stages = {name: s for name, s in summaries.items() if s.get("stages")}
    if not with_stages:
        return ""
    lines = [
        "| algorithm | L1 Acc(L) | L1 Acc(G) | L1 Acc | L2 Acc(L) | L2 Acc(G) | L2 Acc | G Acc(G) | rho_eps at L2 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in with_stages.items():
        stages = s["stages"]
        for suffix in ("", "+"):
            if f"L2{suffix}" not in stages and f"L1{suffix}" not in stages:
                continue
            cells = []
            for stage, key in (
                ("L1", "acc_local"),
                ("L1", "acc_global"),
                ("L1", "acc"),
                ("L2", "acc_local"),
                ("L2", "acc_global"),
                ("L2", "acc"),
                ("G", "acc_global"),
            ):
                stage = stage if stage == "G" else stage + suffix
                cells.append(f"{100 * stages[stage][key][0]:.2f}" if stage in stages else "-")
            l2 = stages.get(f"L2{suffix}")
            rho = ", ".join(f"{e}: {n}/{l2['clients']}" for e, n in l2["rho"].items()) if l2 else "-"
            lines.append(f"| {name}{suffix} | " + " | ".join(cells) + f" | {rho} |")
    return "\n".join(lines)


def cost_table(
    summaries: dict[str, Summary], reference: str = "fedavg", round_seconds: dict[str, float] | None = None
) -> str:
    """Markdown: measured training MB per client (down, up, total), training FLOPs per client, ratios to the
    reference run (the first FedAvg run), wall time, and (when given) the median training round's wall time with its
    ratio to the reference's."""
    ref = summaries.get(reference)
    rounds = round_seconds or {}
    lines = [
        f"| algorithm | MB down / client | MB up / client | MB total / client | bytes vs {reference} "
        f"| training FLOPs / client | FLOPs vs {reference} | wall (s) | training round (s, median) "
        f"| round vs {reference} |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summaries.items():
        mb = s["mb_per_client"]
        total = mb["train_down"] + mb["train_up"]
        flops = s.get("train_flops_per_client", 0.0)
        ratio_b = ratio_f = ratio_r = "n/a"
        if ref:
            ref_total = ref["mb_per_client"]["train_down"] + ref["mb_per_client"]["train_up"]
            ratio_b = f"{total / ref_total:.3f}" if ref_total else "n/a"
            ratio_f = f"{flops / ref['train_flops_per_client']:.3f}" if ref.get("train_flops_per_client") else "n/a"
        if name in rounds and rounds.get(reference):
            ratio_r = f"{rounds[name] / rounds[reference]:.2f}"
        round_s = f"{rounds[name]:.2f}" if name in rounds else "n/a"
        lines.append(
            f"| {name} | {mb['train_down']:.2f} | {mb['train_up']:.2f} | {total:.2f} | {ratio_b} "
            f"| {flops:.3e} | {ratio_f} | {s['wall_seconds']:.0f} | {round_s} | {ratio_r} |"
        )
    return "\n".join(lines)


def median_round_seconds(run_dir: Path) -> float:
    """The median wall time of a run's training rounds after the first, evaluation rounds left out."""
    import statistics

    from experiments.benchmarks.measure import steady_rounds

    return statistics.median(r["wall_s"] for r in steady_rounds(run_dir))


def parse_overrides(text: str) -> dict[str, str]:
    """ "k=v k2='s'" run-config text -> {key: raw value text} (later keys win)."""
    return dict(re.findall(r"([\w-]+)=('[^']*'|\S+)", text))


def merge_config(base: str, overrides: str) -> str:
    """'k=v ...' run-config strings merged, the later value winning (flwr rejects a key given twice)."""
    merged = {**parse_overrides(base), **parse_overrides(overrides)}
    return " ".join(f"{k}={v}" for k, v in merged.items())


def parse_algorithms(spec: str) -> list[tuple[str, str, str]]:
    """'fedavg,fedavg-ft[eval-every=30],drop30:fedamp[drop-rate=0.3]' -> [(label, algorithm, extra run config)]."""
    out = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", spec):
        head, _, extra = item.strip().partition("[")
        label, _, algorithm = head.rpartition(":")
        out.append((label or algorithm, algorithm, extra.rstrip("]")))
    return out


def typed_config(config: str) -> dict[str, Any]:
    """'k=v ...' run-config text as a dict of typed values (numbers and booleans parsed, quotes dropped)."""
    raw = {key: value.strip("'") for key, value in parse_overrides(config).items()}
    return {k: (json.loads(v) if re.fullmatch(r"-?[\d.eE+-]+|true|false", v) else v) for k, v in raw.items()}


def finished_with_config(run_dir: Path, config: str) -> bool:
    """True when run_dir holds a finished run whose saved config equals `config` as parsed (results-dir and run-name
    aside; keys the older run did not record must have their default value)."""
    folder = RunFolder(run_dir)
    if not folder.finished() or not folder.is_run():
        return False
    from common.config import parse_run_config
    from server_app.results import read_run_config

    wanted = parse_run_config(typed_config(config)).to_dict()
    recorded = read_run_config(run_dir)
    return all(recorded.get(key) == value for key, value in wanted.items() if key not in {"results-dir", "run-name"})


def main(argv: list[str] | None = None) -> dict[str, Summary]:
    """Run the algorithms one after another, print the tables and return each run's summary by label."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--algorithms",
        default="fedavg,local",
        help="comma-separated; per-algorithm overrides in brackets: fedavg-ft[eval-every=30]",
    )
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--partition", default="dirichlet")
    parser.add_argument("--alpha", type=float, default=0.3)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--extra", default="", help='more run-config overrides, e.g. "proximal-mu=0.01"')
    parser.add_argument("--results-dir", default="results", help="where the compare-* folder goes (default ./results)")
    parser.add_argument(
        "--resume",
        default="",
        help="an earlier compare-* folder: algorithms it finished with "
        "the same run config are read from it, the others run and are added to it",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="inprocess",
        help="inprocess (default): pflower's in-process engine; simulation: `flwr run` on Flower's Ray simulation",
    )
    parser.add_argument("--workers", type=int, default=0, help="inprocess: worker processes (default: one per core)")
    args = parser.parse_args(argv)
    data_dir = str(Path(args.data_dir).resolve()) if args.data_dir else ""
    results = (
        Path(args.resume).resolve()
        if args.resume
        else Path(args.results_dir).resolve() / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    base = (
        f"dataset='{args.dataset}' data-dir='{data_dir}' partition='{args.partition}' "
        f"dirichlet-alpha={args.alpha} num-rounds={args.rounds} fraction-train={args.fraction} "
        f"local-epochs={args.epochs} batch-size={args.batch_size} lr={args.lr} eval-every={args.eval_every} "
        f"seed={args.seed} results-dir='{results}' {args.extra}"
    )
    summaries: dict[str, Summary] = {}
    # a SIGTERM (e.g. `kill`) unwinds like Ctrl+C, so a SuperLink is stopped, not orphaned
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    engine = make_engine(args.engine, REPO, args.workers)
    try:
        for name, algorithm, extra in parse_algorithms(args.algorithms):
            started = time.monotonic()
            config = merge_config(f"{base} algorithm='{algorithm}' run-name='{name}'", extra)
            if args.resume and finished_with_config(results / name, config):
                summaries[name] = RunFolder(results / name).summary()
                print(f"{name}: finished earlier with the same run config, read from {results / name}", flush=True)
                continue
            lines: list[str] = []
            outcome = engine.run(typed_config(config), args.clients, 24 * 3600, lines.append)
            if outcome.status != "finished:completed":
                sys.exit(f"{name} failed ({outcome.status}):\n" + "\n".join(lines[-40:]))
            summaries[name] = RunFolder(results / name).summary()
            print(f"{name}: done in {time.monotonic() - started:.0f} s ({args.engine})", flush=True)
    finally:
        engine.close()
    print()
    print(
        f"{args.dataset}, {args.partition}({args.alpha}), {args.clients} clients, {args.fraction:.0%} per round, "
        f"{args.rounds} rounds, {args.epochs} local epochs, seed {args.seed}; accuracy (%) mean +/- std over "
        f"clients at the last evaluated round"
    )
    print(accuracy_table(summaries))
    print()
    fedavg_runs = [name for name, algorithm, _ in parse_algorithms(args.algorithms) if algorithm == "fedavg"]
    round_seconds = {
        name: median_round_seconds(results / name)
        for name in summaries
        if RunFolder(results / name).metrics_path.is_file()
    }
    print(cost_table(summaries, reference=fedavg_runs[0] if fedavg_runs else "fedavg", round_seconds=round_seconds))
    stages = stage_table(summaries)
    if stages:
        print("\nStages (FLIU [arXiv:2510.24503] Table I) of the clients trained in the last round, %:")
        print(stages)
    print(f"\nresults: {results}")
    return summaries


if __name__ == "__main__":
    main()
