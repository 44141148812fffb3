"""Run experiments of a sweep file in one process each, with no Flower runtime (server and client halves called
directly, every message still encoded, checked and decoded: tests/inprocess.py), on a GPU where there is one, at
a budget set on the command line (e.g. a paper's rounds and epochs). For a machine without the data sets,
`--export` writes the samples those runs read (and every label, so the partitions come out the same) to one
compressed file that `--data` reads there.

    python bench/inprocess_run.py --experiments digits-fedavg,digits-dapperfl --set num-rounds=100 \\
        --set local-epochs=5 --export /tmp/digits-seed0.npz          # here, where ../shared/data is
    python bench/inprocess_run.py --experiments digits-fedavg,digits-dapperfl --set num-rounds=100 \\
        --set local-epochs=5 --data /tmp/digits-seed0.npz --device cuda --out /tmp/paper-scale

Prints, per experiment, the mean accuracy of the clients' own evaluation (acc-shift-0) and, on multi-domain data,
the global model's accuracy per domain and their mean, at every evaluation (and a progress line for each round
between evaluations); `--out` keeps them as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common.config import ConfigError, RunConfig, parse_run_config  # noqa: E402
from common.data.arrays import DatasetArrays  # noqa: E402
from common.data.domains import DOMAINS  # noqa: E402
from experiments.runs import RunSpec  # noqa: E402
from experiments.sweep import load_sweep  # noqa: E402


def run_config(spec: RunSpec, overrides: dict[str, str], results: str) -> dict:
    """The experiment's run config with the command line's overrides, its state in memory, results in `results`."""
    raw: dict = {**spec.run_config, "client-state-dir": "memory", "results-dir": results}
    for key, value in overrides.items():
        try:
            raw[key] = json.loads(value)  # numbers and booleans
        except ValueError:
            raw[key] = value
    return raw


def rows_read(cfg: RunConfig, clients: int) -> set[int]:
    """The data set rows a run reads: its clients' train, test and shift-draw rows, and the domains' test rows."""
    from common.data.federated import federated_split
    from common.data.shift import make_shift_plan
    from common.seeding import derive_seed

    split = federated_split(cfg, clients)
    rows: set[int] = set()
    for pid in range(clients):
        rows.update(split.train[pid].tolist())
        rows.update(split.test[pid].tolist())
        rows.update(make_shift_plan(split.test[pid], split.pool, derive_seed(cfg.seed, "shift", pid)).draws.tolist())
    for held_out in split.domain_test:
        rows.update(held_out.tolist())
    return rows


def export(specs: list[RunSpec], overrides: dict[str, str], path: Path) -> None:
    """Write every sample the runs read and every label (the partitions are computed from the labels)."""
    from common.data.federated import dataset_for

    rows: set[int] = set()
    data: DatasetArrays | None = None
    for spec in specs:
        cfg = parse_run_config(run_config(spec, overrides, tempfile.gettempdir()))
        data = dataset_for(cfg)
        rows |= rows_read(cfg, spec.clients)
    assert data is not None
    index = np.array(sorted(rows), dtype=np.int64)
    extra = {"domain": data.domain} if data.domain is not None else {}
    np.savez_compressed(path, name=data.name, x=data.x[index], index=index, n=len(data.y), y=data.y,
                        num_classes=data.num_classes, mean=data.mean, std=data.std, scale=data.scale,
                        domain_names=np.array(data.domain_names), **extra)
    print(f"wrote {path}: {len(index):,} of {len(data.y):,} samples, {path.stat().st_size / 1e6:.1f} MB")


def use_export(path: Path) -> set[int]:
    """Serve the data set from an `--export` file in this process (the exported rows in place, zeros elsewhere,
    never read by its runs); returns the rows it holds."""
    import common.data.federated as federated

    z = np.load(path, allow_pickle=False)
    x = np.zeros((int(z["n"]), *z["x"].shape[1:]), dtype=z["x"].dtype)
    x[z["index"]] = z["x"]
    exported = DatasetArrays(str(z["name"]), x, z["y"], int(z["num_classes"]), tuple(z["mean"].tolist()),
                             tuple(z["std"].tolist()), float(z["scale"]), z["domain"] if "domain" in z else None,
                             tuple(z["domain_names"].tolist()))
    federated.load_dataset = lambda *args, **kwargs: exported  # type: ignore[assignment]
    return set(z["index"].tolist())


def check_export(specs: list[RunSpec], overrides: dict[str, str], path: Path) -> None:
    """Exit with a message unless the --export file holds every row these runs read."""
    if not path.is_file():
        sys.exit(f"--data {path}: no such file")
    held = use_export(path)
    for spec in specs:
        missing = rows_read(parse_run_config(run_config(spec, overrides, tempfile.gettempdir())), spec.clients) - held
        if missing:
            sys.exit(f"{path} lacks {len(missing):,} of the samples {spec.name} reads: export it with the same "
                     "--experiments, --seeds and --set")


def summarize(replies: dict) -> dict:
    """Mean of the clients' acc-shift-0; per domain, the global model's accuracy on it, and the mean over domains."""
    metrics = [reply.metric_records["metrics"] for reply in replies.values()]
    row: dict = {"acc": float(np.mean([m["acc-shift-0"] for m in metrics]))}
    domains: dict[str, list[float]] = {}
    for m in metrics:
        if "domain-id" in m:
            domains.setdefault(DOMAINS[int(m["domain-id"])], []).append(float(m["domain-acc"]))
    if domains:
        row["domains"] = {name: float(np.mean(values)) for name, values in sorted(domains.items())}
        row["global"] = float(np.mean(list(row["domains"].values())))
    return row


def run_one(job: tuple[RunSpec, dict[str, str], str, str | None, str, int]) -> dict:
    """One experiment: train every round, evaluate every `eval_every` rounds and at the end; JSON lines to out."""
    spec, overrides, device, data_file, out, eval_every = job
    import torch

    from tests.inprocess import InProcessFederation

    logging.getLogger("flwr").setLevel(logging.WARNING)
    torch.set_num_threads(2)
    if data_file:
        use_export(Path(data_file))
    with tempfile.TemporaryDirectory() as results:
        cfg = parse_run_config(run_config(spec, overrides, results))
        federation = InProcessFederation(cfg, spec.clients, device=device)
        log = Path(out) / f"{spec.name}.jsonl"
        started, rows = time.perf_counter(), []
        for rnd in range(1, cfg.num_rounds + 1):
            federation.train_round(rnd)
            if rnd % eval_every and rnd != cfg.num_rounds:  # progress between evaluations
                print(f"{spec.name} round {rnd}/{cfg.num_rounds} trained "
                      f"({time.perf_counter() - started:.1f} s)", flush=True)
                continue
            row = {"round": rnd, "elapsed_s": round(time.perf_counter() - started, 1),
                   **summarize(federation.evaluate(rnd))}
            rows.append(row)
            with log.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
            print(f"{spec.name} round {rnd}: " + ", ".join(
                f"{k} {v:.4f}" for k, v in row.items() if isinstance(v, float) and k != "elapsed_s")
                + f" ({row['elapsed_s']} s)", flush=True)
    return {"name": spec.name, "rows": rows}


def main() -> None:
    """Parse the command line; export the data, or run the experiments (in parallel processes) and print a table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", default=str(REPO / "bench" / "sweeps" / "results.toml"))
    parser.add_argument("--experiments", required=True, help="comma-separated experiment names of the sweep")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a run-config key over the sweep's (repeatable), e.g. num-rounds=100")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--data", help="read the data from an --export file instead of the data sets")
    parser.add_argument("--export", help="write the samples these runs read to this .npz and stop")
    parser.add_argument("--parallel", type=int, default=1, help="experiments run at once, one process each")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--out", default=str(REPO / "results" / "inprocess"))
    args = parser.parse_args()
    try:
        overrides = dict(item.split("=", 1) for item in args.set)
    except ValueError:
        sys.exit(f"--set takes KEY=VALUE, got {args.set}")
    try:
        _, specs = load_sweep(Path(args.sweep))
    except ConfigError as exc:
        sys.exit(str(exc))
    wanted, seeds = args.experiments.split(","), {int(s) for s in args.seeds.split(",")}
    unknown = sorted(set(wanted) - {s.experiment for s in specs})
    if unknown:
        sys.exit(f"no experiment(s) {unknown} in {args.sweep}")
    chosen = [s for s in specs if s.experiment in wanted and s.seed in seeds]
    try:
        for spec in chosen:
            parse_run_config(run_config(spec, overrides, tempfile.gettempdir()))
    except ConfigError as exc:
        sys.exit(f"--set: {exc}")
    if args.export:
        export(chosen, overrides, Path(args.export))
        return
    import torch

    try:
        torch.empty(1, device=args.device)
    except (RuntimeError, AssertionError) as exc:
        sys.exit(f"--device {args.device}: {str(exc).splitlines()[0]}")
    if args.data:
        check_export(chosen, overrides, Path(args.data))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    jobs = [(spec, overrides, args.device, args.data, args.out, args.eval_every) for spec in chosen]
    with multiprocessing.get_context("spawn").Pool(max(1, args.parallel)) as pool:
        outcomes = pool.map(run_one, jobs, chunksize=1)
    print("\n| run | round | clients' own accuracy | global model, mean over domains | per domain | seconds |")
    print("|---|---|---|---|---|---|")
    for outcome in outcomes:
        for row in outcome["rows"]:
            domains = " ".join(f"{k} {v:.3f}" for k, v in row.get("domains", {}).items())
            print(f"| {outcome['name']} | {row['round']} | {row['acc']:.4f} | {row.get('global', float('nan')):.4f} "
                  f"| {domains} | {row['elapsed_s']} |")


if __name__ == "__main__":
    main()
