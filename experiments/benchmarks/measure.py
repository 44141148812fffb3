"""What the benchmarks measure runs against: the raw training loop's samples per second (one thread alone, and every
worker's share running at once), the steady rounds of a finished run, and the peak memory of a process tree."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from common.storage.run_folder import RoundRecord, RunFolder, evaluation
from experiments.run.superlink import descendants


def raw_seconds(raw: dict[str, Any], clients: int, partition_ids: list[int]) -> tuple[int, float]:
    """The project's training loop alone (common/learning/train.py), one thread, on the given clients' data, each from
    the model's initialization, after one untimed training: (samples trained, seconds)."""
    import torch

    from common.config import parse_run_config
    from common.data.federated import client_data
    from common.learning.models import build_model
    from common.learning.train import TrainSettings, train
    from common.seeding import derive_seed

    cfg = parse_run_config(raw)
    torch.set_num_threads(1)
    device = torch.device("cuda" if cfg.device == "cuda" else "cpu")
    settings = TrainSettings(epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr=cfg.lr)
    samples, seconds = 0, 0.0
    # the first client trains once untimed: a process's first training pays one-time costs (the optimizer's import
    # of torch._dynamo, 1-1.5 s, first allocations) that a long-lived worker pays once at its start; a few seconds
    # of timed loop would count them as training and put the engines above 100% of the loop
    for index, pid in enumerate(partition_ids[:1] + partition_ids):
        data = client_data(cfg.data, pid, clients)
        model = build_model(
            cfg.model, cfg.dataset, data.input_shape, data.num_classes, derive_seed(cfg.seed, "model")
        ).to(device)
        started = time.perf_counter()
        train(model, data.train_x, data.train_y, settings, torch.Generator().manual_seed(pid), device=device)
        if index > 0:
            seconds += time.perf_counter() - started
            samples += cfg.local_epochs * data.num_train
    return samples, seconds


def raw_rate(raw: dict[str, Any], clients: int, max_clients: int = 20) -> float:
    """Samples per second of the training loop alone on one thread, over (up to `max_clients` of) the clients."""
    samples, seconds = raw_seconds(raw, clients, list(range(min(clients, max_clients))))
    return samples / seconds


def raw_rate_together(raw: dict[str, Any], clients: int, workers: int, max_clients: int = 20) -> float:
    """Samples per second of the training loop on `workers` processes at once (one thread each, the clients dealt
    out among them): what the machine gives when every core trains, memory and caches shared."""
    ids = list(range(min(clients, max(max_clients, workers))))
    shares = [ids[w::workers] for w in range(workers)]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        started = time.perf_counter()
        done = pool.starmap(raw_seconds, [(raw, clients, share) for share in shares])
        wall = time.perf_counter() - started
    # each process's loop time, not the pool's start-up: the slowest worker bounds the round
    return sum(samples for samples, _ in done) / max(seconds for _, seconds in done) if wall > 0 else 0.0


def steady_rounds(run_dir: Path) -> list[RoundRecord]:
    """A finished run's training rounds after the first, without the evaluation rounds (the steady state)."""
    records = RunFolder(Path(run_dir)).rounds()
    steady = [r for r in records if r["round"] > 1 and not evaluation(r)]
    return steady or [r for r in records if not evaluation(r)] or records


def round_rate(run_dir: Path, local_epochs: int) -> dict[str, float]:
    """Samples per second of a run's steady rounds (median) and their wall time, its first round's and its last
    (evaluating) round's wall time."""
    records = RunFolder(Path(run_dir)).rounds()
    steady = steady_rounds(run_dir)
    return {
        "rate": statistics.median(r["train"]["num_examples"] * local_epochs / r["wall_s"] for r in steady),
        "round_s": statistics.median(r["wall_s"] for r in steady),
        "first_round_s": records[0]["wall_s"],
        "last_round_s": records[-1]["wall_s"],
    }


def message_digests(run_dir: Path) -> list[str]:
    """A run's message digests (run-config message-digests), each as 'round kind client digest', sorted: replies
    arrive in any order, so two runs that exchanged the same messages give the same list."""
    rows = RunFolder(Path(run_dir)).digests()
    return sorted(f"{r['round']} {r['kind']} {r['client']} {r['digest']}" for r in rows)


def tree_memory(pid: int) -> tuple[int, int]:
    """(RSS, anonymous RSS) in bytes summed over `pid` and every process below it."""
    rss = anon = 0
    for proc in [pid, *descendants(pid)]:
        try:
            fields = dict(
                line.split(":", 1) for line in Path(f"/proc/{proc}/status").read_text().splitlines() if ":" in line
            )
        except OSError:
            continue
        rss += int(fields.get("VmRSS", "0 kB").split()[0]) * 1024
        anon += int(fields.get("RssAnon", "0 kB").split()[0]) * 1024
    return rss, anon


def shared_memory_in_use() -> int:
    """Bytes in use in /dev/shm (the in-process engine's message and client-state blocks; 0 where there is none)."""
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return 0
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


class PeakMemory:
    """Samples a process tree's memory in a thread; `peak` holds the largest (RSS, anon) seen, each with the shared
    memory in use added (blocks no process maps between two messages are resident all the same); `peak_disk` the
    most the file system holding `disk` (when given) filled beyond its use at the start."""

    def __init__(self, pid: int, every: float = 0.5, disk: Path | None = None) -> None:
        self.pid, self.every, self.peak = pid, every, (0, 0)
        self.disk, self.peak_disk = disk, 0
        self._disk_start = shutil.disk_usage(disk).used if disk is not None else 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss, anon = tree_memory(self.pid)
            shared = shared_memory_in_use()
            rss, anon = rss + shared, anon + shared
            self.peak = (max(self.peak[0], rss), max(self.peak[1], anon))
            if self.disk is not None:
                self.peak_disk = max(self.peak_disk, shutil.disk_usage(self.disk).used - self._disk_start)
            self._stop.wait(self.every)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
