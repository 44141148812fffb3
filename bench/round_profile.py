"""Where a simulated round's wall time goes: per client message and on the server, for each algorithm.

Runs each algorithm through `flwr run` on a private local SuperLink with PFLOWER_PROFILE set, so every process
(the ServerApp, each Ray worker running ClientApps) appends its timed phases to a JSON-lines file
(common/profiling.py); then prints, per algorithm, the first round and the median of the later ones:

  server   build (the strategy's per-client content: FedAMP's cloud models, masks), messages (Message objects and
           their bytes counted), flower (pushing the messages, pulling and waiting for replies: the round trip
           through the SuperLink and the workers), check (reply limits and bytes), aggregate (decode, validate,
           the strategy's step; a training round checks and decodes each reply while the others still train),
           checkpoint (the server state written every `checkpoint-every` rounds), rest
  clients  per message: env (config, data and partition, state), decode (model build + received arrays), train,
           evaluate, encode, flops, persist, other (the handler's rest); outside the handler: per worker, the part
           of the round trip it was not running a handler (Flower's and Ray's scheduling, polling, (de)serialization
           and transfer), and process start-up (process start to its first message)

The default setting is FedAMP's grouped MNIST: 100 clients, all per round, 1 epoch, batch 100, cnn-mnist.

    python bench/round_profile.py --data-dir ../shared/data [--algorithms fedavg,fedamp,dmpfl] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from experiments.run.superlink import LocalSuperLink

REPO = Path(__file__).resolve().parent.parent  # the Flower app the simulation runs

CLIENT_PHASES = ("env", "decode", "train", "evaluate", "encode", "flops", "persist")
SERVER_PHASES = ("build", "messages", "flower", "check", "aggregate", "checkpoint")


def read_lines(folder: Path) -> list[dict]:
    """Every profile line the run's processes wrote."""
    return [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]


def busy_seconds(intervals: list[tuple[float, float]], window: tuple[float, float]) -> float:
    """Seconds of `window` covered by the (start, end) intervals (merged)."""
    covered, last = 0.0, window[0]
    for start, end in sorted(intervals):
        start, end = max(start, last), min(end, window[1])
        if end > start:
            covered += end - start
            last = end
    return covered


def round_rows(lines: list[dict]) -> dict[int, dict[str, float]]:
    """Per round: seconds per server phase, per client message phase (mean over the round's messages), and the
    workers' idle share of the round trip."""
    server = {line["round"]: line for line in lines if line["side"] == "server"}
    clients = [line for line in lines if line["side"] == "client" and line["kind"] in ("train", "evaluate")]
    rows: dict[int, dict[str, float]] = {}
    for rnd, line in sorted(server.items()):
        phases = dict(line["phases"])
        row = {"round wall": line["end"] - line["start"]}
        nested = {"messages": phases.get("build", 0.0)}  # build runs inside messages
        for name in SERVER_PHASES:
            row[f"server {name}"] = phases.get(name, 0.0) - nested.get(name, 0.0)
        row["server rest"] = row["round wall"] - sum(row[f"server {name}"] for name in SERVER_PHASES)
        mine = [c for c in clients if c["round"] == rnd]
        by_phase: dict[str, list[float]] = defaultdict(list)
        for c in mine:
            total = c["end"] - c["start"]
            for name in CLIENT_PHASES:
                by_phase[name].append(c["phases"].get(name, 0.0))
            by_phase["other"].append(total - sum(c["phases"].get(name, 0.0) for name in CLIENT_PHASES))
            by_phase["handler"].append(total)
        for name, values in by_phase.items():
            row[f"client {name} (ms/msg)"] = 1000 * statistics.fmean(values)
        row["messages"] = len(mine)
        workers: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for c in mine:
            workers[c["os_pid"]].append((c["start"], c["end"]))
        window = (line["start"], line["end"])
        idle = [1 - busy_seconds(spans, window) / (window[1] - window[0]) for spans in workers.values()]
        row["workers"] = len(workers)
        row["worker idle share"] = statistics.fmean(idle) if idle else float("nan")
        rows[rnd] = row
    return rows


def startup_seconds(lines: list[dict]) -> float:
    """Mean over worker processes: process start to the start of its first message (imports, Ray, Flower)."""
    firsts = [line for line in lines if line["side"] == "client" and line["first"] and line.get("started_at")]
    return statistics.fmean(line["start"] - line["started_at"] for line in firsts) if firsts else float("nan")


def table(profiles: dict[str, list[dict]]) -> str:
    """Markdown: one column pair per algorithm (first round, median of the later rounds)."""
    per_alg = {name: round_rows(lines) for name, lines in profiles.items()}
    keys = list(next(iter(next(iter(per_alg.values())).values())))
    for rows in per_alg.values():
        for row in rows.values():
            keys += [k for k in row if k not in keys]
    header = "| phase | " + " | ".join(f"{name} round 1 | {name} later (median)" for name in per_alg) + " |"
    lines = [header, "|---|" + "---|---|" * len(per_alg)]
    for key in keys:
        cells = []
        for rows in per_alg.values():
            first = rows.get(min(rows), {}).get(key, float("nan"))
            later = [row[key] for rnd, row in rows.items() if rnd > min(rows) and key in row]
            cells += [_fmt(key, first), _fmt(key, statistics.median(later) if later else float("nan"))]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines.append(
        "| worker start-up (s, process start to first message) | "
        + " | ".join(f"{startup_seconds(lines_):.2f} | " for lines_ in profiles.values())
        + "|"
    )
    return "\n".join(lines)


def _fmt(key: str, value: float) -> str:
    if key in ("messages", "workers"):
        return f"{value:.0f}"
    if key == "worker idle share":
        return f"{100 * value:.1f}%"
    return f"{value:.1f}" if "ms/msg" in key else f"{value:.2f} s"


def main() -> None:
    """Run each algorithm with profiling on and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", default="fedavg,fedamp,dmpfl")
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--dataset", default="mnist")
    parser.add_argument("--partition", default="grouped")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--fraction", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--model", default="cnn-mnist")
    parser.add_argument("--extra", default="", help="more run-config overrides")
    parser.add_argument(
        "--ray-cpus",
        type=int,
        default=0,
        help="CPUs Ray is told the machine has (0: its cores); more than the cores runs that many clients at once",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="round-profile-"))
    base = (
        f"dataset='{args.dataset}' data-dir='{Path(args.data_dir).resolve()}' partition='{args.partition}' "
        f"num-rounds={args.rounds} fraction-train={args.fraction} local-epochs={args.epochs} "
        f"batch-size={args.batch_size} model='{args.model}' eval-every={args.rounds} pretrain-epochs=0 "
        f"results-dir='{work / 'results'}' {args.extra}"
    )
    profiles: dict[str, list[dict]] = {}
    for algorithm in args.algorithms.split(","):
        folder = work / algorithm
        folder.mkdir()
        os.environ["PFLOWER_PROFILE"] = str(folder)  # inherited by the SuperLink, the simulation and its workers
        started = time.monotonic()
        with LocalSuperLink(work / f"flwr-home-{algorithm}") as link:
            outcome = link.run(
                REPO,
                f"{base} algorithm='{algorithm}'",
                num_supernodes=args.clients,
                timeout=3600,
                ray_cpus=args.ray_cpus,
            )
        if outcome.status != "finished:completed":
            sys.exit(f"{algorithm} failed ({outcome.status}):\n{outcome.output[-3000:]}")
        profiles[algorithm] = read_lines(folder)
        for bulky in (work / "results", work / f"flwr-home-{algorithm}"):  # checkpoints and client state: GBs
            shutil.rmtree(bulky, ignore_errors=True)
        print(f"{algorithm}: {time.monotonic() - started:.0f} s", flush=True)
    print(
        f"\n{args.dataset} {args.partition}, {args.clients} clients, {args.fraction:.0%} per round, {args.epochs} "
        f"epoch(s), batch {args.batch_size}, {args.model}, {args.rounds} rounds (the last one also evaluates "
        f"every client); seconds per round, ms per client message:"
    )
    print(table(profiles))
    print(f"\nprofiles: {work}")


if __name__ == "__main__":
    main()
