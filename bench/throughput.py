"""Simulation efficiency: training samples per second of wall time in a simulated round, against the same model's
raw training loop on the same clients' data in one process.

The raw loop is the project's own training loop (common/train.py) run client after client with one thread, times
the number of simulated workers (each runs one client at a time on one thread): the most the machine can give.
A simulated round's rate is (samples x local epochs) / the round's wall time (median over the rounds after the
first, the evaluation round left out); efficiency is the ratio. Two settings:

  grouped  FedAMP's grouped MNIST: 100 clients, all per round, 1 epoch, batch 100, cnn-mnist
  fmnist   Fashion-MNIST Dir(0.3): 50 clients, 10 per round, 2 epochs, batch 64, cnn-mnist

    python bench/throughput.py --data-dir ../shared/data [--setting grouped] [--algorithms fedavg,fedamp,dmpfl]
    python bench/throughput.py --model cnn-cifar   # the 582,026-parameter CNN other PFL libraries use for MNIST
    python bench/throughput.py --in-process        # also each algorithm in one process, no runtime: its own ceiling
    python bench/throughput.py --bare              # also Flower's own FedAvg (bench/bare_fedavg): the runtime's share
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common.config import parse_run_config  # noqa: E402
from common.data.federated import client_data  # noqa: E402
from common.models import build_model  # noqa: E402
from common.seeding import derive_seed  # noqa: E402
from common.train import TrainSettings, train  # noqa: E402
from experiments.presets import run_config_text  # noqa: E402
from tests.harness.local_superlink import LocalSuperLink  # noqa: E402

SETTINGS = {
    "grouped": {"dataset": "mnist", "partition": "grouped", "clients": 100, "fraction-train": 1.0, "local-epochs": 1,
                "batch-size": 100},
    "fmnist": {"dataset": "fashion-mnist", "partition": "dirichlet", "clients": 50, "fraction-train": 0.2,
               "local-epochs": 2, "batch-size": 64},
}


def raw_rate(raw: dict, clients: int, max_clients: int = 20) -> float:
    """Samples per second of the training loop alone, one thread, over (up to `max_clients` of) the clients."""
    cfg = parse_run_config(raw)
    torch.set_num_threads(1)
    samples, seconds = 0, 0.0
    for pid in range(min(clients, max_clients)):
        data = client_data(cfg, pid, clients)
        model = build_model(cfg.model, cfg.dataset, data.input_shape, data.num_classes, derive_seed(cfg.seed, "model"))
        settings = TrainSettings(epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr=cfg.lr)
        started = time.perf_counter()
        train(model, data.train_x, data.train_y, settings, torch.Generator().manual_seed(pid))
        seconds += time.perf_counter() - started
        samples += cfg.local_epochs * data.num_train
    return samples / seconds


def in_process(raw: dict, clients: int) -> dict:
    """The same algorithm's rounds with no runtime at all: server and client halves called in one process on one
    thread (tests/inprocess.py), every message still encoded, checked and decoded. Its rate times the workers is
    what a simulation of this algorithm could reach if being distributed cost nothing."""
    from tests.inprocess import InProcessFederation

    cfg = parse_run_config({**raw, "client-state-dir": "memory"})
    torch.set_num_threads(1)
    federation = InProcessFederation(cfg, clients)
    rates, seconds = [], []
    for rnd in range(1, cfg.num_rounds + 1):
        started = time.perf_counter()
        replies = federation.train_round(rnd)
        elapsed = time.perf_counter() - started
        samples = sum(federation.data[pid].num_train for pid in replies) * cfg.local_epochs
        if rnd > 1:
            rates.append(samples / elapsed)
            seconds.append(elapsed)
    return {"rate": statistics.median(rates), "round_s": statistics.median(seconds)}


def simulated(link: LocalSuperLink, raw: dict, clients: int, results: Path, ray_cpus: int) -> dict:
    """Run through `flwr run`; the steady rounds' sample rate, their wall times, and the final accuracy."""
    run_dir = results / raw["run-name"]
    outcome = link.run(REPO, run_config_text({**raw, "results-dir": str(results)}), num_supernodes=clients,
                       ray_cpus=ray_cpus, timeout=3600)
    if outcome.status != "finished:completed":
        sys.exit(f"{raw['algorithm']} failed ({outcome.status}):\n{outcome.output[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = [r for r in records if r["round"] > 1 and not r.get("eval")]
    rates = [r["train"]["num_examples"] * raw["local-epochs"] / r["wall_s"] for r in steady]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"rate": statistics.median(rates), "first_round_s": records[0]["wall_s"],
            "round_s": statistics.median(r["wall_s"] for r in steady),
            "accuracy": summary["final"]["mean"].get("acc-shift-0", float("nan"))}


def bare_rounds(path: Path) -> tuple[list[dict], list[dict]]:
    """The training and the evaluation rounds bench/bare_fedavg recorded in its round-times file."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in records if r["kind"] == "train"], [r for r in records if r["kind"] == "evaluate"]


def bare_flower(link: LocalSuperLink, raw: dict, clients: int, results: Path, ray_cpus: int) -> dict:
    """The same setting on a FedAvg built only from Flower's classes (bench/bare_fedavg): what the runtime itself
    leaves of the raw loop, with none of this project's work (no codec, checks, state or results)."""
    times = results / "bare-round-times.jsonl"
    config = {**{k: v for k, v in raw.items() if k not in ("algorithm", "run-name", "eval-every", "pretrain-epochs")},
              "fraction-evaluate": 0.0, "round-times": str(times)}
    outcome = link.run(REPO / "bench" / "bare_fedavg", run_config_text(config), num_supernodes=clients,
                       ray_cpus=ray_cpus, timeout=3600)
    if outcome.status != "finished:completed":
        sys.exit(f"bare Flower FedAvg failed ({outcome.status}):\n{outcome.output[-3000:]}")
    training, _ = bare_rounds(times)
    steady = [r for r in training if r["round"] > 1]
    return {"rate": statistics.median(r["num_examples"] * raw["local-epochs"] / r["wall_s"] for r in steady),
            "first_round_s": training[0]["wall_s"], "round_s": statistics.median(r["wall_s"] for r in steady),
            "accuracy": float("nan")}


def main() -> None:
    """Measure the raw loop, run each algorithm, print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="grouped")
    parser.add_argument("--algorithms", default="fedavg,fedamp,dmpfl")
    parser.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    parser.add_argument("--model", default="cnn-mnist")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2, help="CPU cores the simulation may use (the ideal is the "
                        "raw loop's rate times this)")
    parser.add_argument("--ray-cpus", type=int, default=0,
                        help="CPUs Ray is told the machine has (init-args-num-cpus; 0: its own count); e.g. 4 on 2 "
                        "cores runs two clients per core")
    parser.add_argument("--in-process", action="store_true", help="also run each algorithm in one process with no "
                        "runtime (one thread, x workers): the ceiling for that algorithm, its own extra work included")
    parser.add_argument("--bare", action="store_true", help="also run a FedAvg built only from Flower's classes "
                        "(bench/bare_fedavg) at the same setting: the runtime's own share, none of this project's")
    parser.add_argument("--extra", default="", help="more run-config overrides, k=v separated by spaces")
    args = parser.parse_args()
    if args.rounds < 3:  # round 1 is the warm-up and the last one also evaluates: neither is a steady round
        parser.error(f"--rounds must be at least 3 (a steady round besides the first and the last), got {args.rounds}")
    setting = dict(SETTINGS[args.setting])
    clients = setting.pop("clients")
    base = {**setting, "data-dir": str(Path(args.data_dir).resolve()), "model": args.model, "lr": 0.05,
            "num-rounds": args.rounds, "eval-every": args.rounds, "pretrain-epochs": 0}
    for item in args.extra.split():
        key, _, value = item.partition("=")
        base[key] = json.loads(value) if value.replace(".", "", 1).isdigit() else value.strip("'")
    per_thread = raw_rate({**base, "algorithm": "fedavg"}, clients)
    ideal = per_thread * args.workers
    print(f"raw training loop: {per_thread:,.0f} samples/s per thread, x {args.workers} workers = {ideal:,.0f}",
          flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="throughput-") as tmp, LocalSuperLink(Path(tmp) / "flwr-home") as link:
        results = Path(tmp)  # run folders with checkpoints and client state: GBs, removed at the end
        for algorithm in args.algorithms.split(","):
            out = simulated(link, {**base, "algorithm": algorithm, "run-name": algorithm}, clients, results,
                            args.ray_cpus)
            if args.in_process:
                alone = in_process({**base, "algorithm": algorithm, "run-name": algorithm}, clients)
                out["in_process"] = alone["rate"] * args.workers
                print(f"{algorithm} in one process: {alone['rate']:,.0f} samples/s on one thread, "
                      f"{alone['round_s']:.2f} s per round", flush=True)
            rows.append((algorithm, out))
            print(f"{algorithm}: {out['rate']:,.0f} samples/s, {out['round_s']:.2f} s per round", flush=True)
        if args.bare:
            out = bare_flower(link, {**base, "run-name": "bare"}, clients, results, args.ray_cpus)
            rows.append(("bare Flower FedAvg", out))
            print(f"bare Flower FedAvg: {out['rate']:,.0f} samples/s, {out['round_s']:.2f} s per round", flush=True)
    print(f"\n{args.setting}: {setting['dataset']} {setting['partition']}, {clients} clients, "
          f"{setting['fraction-train']:.0%} per round, {setting['local-epochs']} epoch(s), batch "
          f"{setting['batch-size']}, {args.model}, {args.rounds} rounds, {args.workers} cores, "
          f"Ray told of {args.ray_cpus or 'all'} CPUs")
    alone = " in one process x workers | share of that |" if args.in_process else ""
    print("| algorithm | samples/s (simulated) | raw loop x workers | efficiency |" + alone + " s per round (median) "
          "| first round (s) | accuracy after the last round |")
    print("|---|---|---|---|" + ("---|---|" if args.in_process else "") + "---|---|---|")
    for algorithm, out in rows:
        cells = ""
        if args.in_process:
            cells = (f" {out['in_process']:,.0f} | {out['rate'] / out['in_process']:.1%} |" if "in_process" in out
                     else " - | - |")
        accuracy = "-" if math.isnan(out["accuracy"]) else f"{100 * out['accuracy']:.2f}"
        print(f"| {algorithm} | {out['rate']:,.0f} | {ideal:,.0f} | {out['rate'] / ideal:.1%} |{cells} "
              f"{out['round_s']:.2f} | {out['first_round_s']:.2f} | {accuracy} |")


if __name__ == "__main__":
    main()
