"""A sweep's shards side by side on one GPU machine within a deadline, its finished runs packed for the way back.

For a GPU held for minutes: starts CUDA's Multi-Process Service (so that the shards' small kernels run side by side
instead of taking turns) when `nvidia-cuda-mps-control` is there and no daemon runs yet, starts `--shards` sweep
shards at once (`pflower sweep FILE --shard K/N --workers W`, each in its own process group, logging to
OUT/logs/shard-K.log), stops those still running at `--deadline-s` (each run resumes from its last round's
checkpoint when the sweep is run again), quits the daemon it started, prints how each shard ended and the runs
finished, and with `--pack DIR` writes the finished runs' folders and every log to DIR/runs.tgz (in 15 MiB parts
runs.tgz.00, .01, ... when larger, and the sha256 of the whole in DIR/runs.sha256; `python bench/gpu_unpack.py DIR
--into results/NAME` joins, checks and unpacks them). Back on the development
machine, `pflower sweep FILE --budget 10m --commit` lands every unpacked finished run as a run record (its behaviour
hash from the code at the commit the run recorded) and commits it with the study's documents (docs/studies.md). On
a machine without the data sets, carry an export (`pflower export FILE --webp --out X.npz`) and pass
`--data-export X.npz`.

    python bench/gpu_sweep.py bench/sweeps/paper_cifar.toml --shards 5 --workers 3 --deadline-s 540 \\
        --only 'cifar-ditto,cifar-feddst' --data-export cifar60k.npz --pack "$OUT"
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from common.hparams import ConfigError
from experiments.run.side_by_side import LOGS, finished_runs, pack, run_side_by_side, shard_command
from experiments.run.sweep import load_sweep

REPO = Path(__file__).resolve().parent.parent
MPS = "nvidia-cuda-mps-control"


def start_mps() -> bool:
    """Start the MPS daemon when the tool is there and none answers yet; whether this call started it."""
    if shutil.which(MPS) is None:
        print("MPS: nvidia-cuda-mps-control not found (on a GPU the shards' kernels take turns)")
        return False
    running = subprocess.run([MPS], input="get_server_list\n", capture_output=True, text=True, timeout=30)
    if running.returncode == 0:
        print("MPS: a daemon already runs")
        return False
    started = subprocess.run([MPS, "-d"], capture_output=True, text=True, timeout=30)
    print("MPS: started" if started.returncode == 0 else f"MPS: not started ({started.stderr.strip()})")
    return started.returncode == 0


def stop_mps() -> None:
    """Quit the MPS daemon."""
    subprocess.run([MPS], input="quit\n", capture_output=True, text=True, timeout=60)


def main(argv: list[str] | None = None) -> int:
    """Run the shards, report, pack; 0 when every shard ended by itself with 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="the sweep file")
    parser.add_argument("--out", type=Path, help="the sweep's results folder (default results/<sweep name>)")
    parser.add_argument("--shards", type=int, default=4, help="sweep shards side by side (default 4)")
    parser.add_argument("--workers", type=int, default=3, help="client worker processes per shard (default 3)")
    parser.add_argument("--deadline-s", type=float, default=540.0, help="stop what still runs after this many seconds")
    parser.add_argument("--only", action="append", default=[], help="as `pflower sweep --only` (may repeat)")
    parser.add_argument("--data-export", type=Path, help="as `pflower sweep --data-export`")
    parser.add_argument("--pack", type=Path, help="write DIR/runs.tgz (or its parts) of the finished runs and logs")
    parser.add_argument("--no-mps", action="store_true", help="do not start CUDA's Multi-Process Service")
    args = parser.parse_args(argv)
    if not args.file.is_file():
        parser.error(f"{args.file}: no such sweep file")
    if args.shards < 1 or args.workers < 1 or args.deadline_s <= 0:
        parser.error("--shards and --workers must be at least 1, --deadline-s above 0")
    if args.data_export is not None and not args.data_export.is_file():
        parser.error(f"--data-export {args.data_export}: no such file")
    try:
        name, _ = load_sweep(args.file)
    except ConfigError as exc:
        parser.error(str(exc))
    extra = [a for only in args.only for a in ("--only", only)]
    extra += ["--data-export", str(args.data_export)] if args.data_export is not None else []
    out = (args.out or REPO / "results" / name).resolve()
    before = {p.name for p in finished_runs(out)}
    commands = [shard_command(args.file, k, args.shards, args.workers, out, extra) for k in range(1, args.shards + 1)]
    logs = [out / LOGS / f"shard-{k}.log" for k in range(1, args.shards + 1)]
    started_mps = not args.no_mps and start_mps()

    def progress(elapsed: float) -> None:
        if int(elapsed) % 60 < 5:
            done = len(finished_runs(out)) - len(before)
            print(f"{elapsed:.0f} s: {done} runs finished", flush=True)

    try:
        ends = run_side_by_side(commands, logs, args.deadline_s, cwd=REPO, on_poll=progress)
    finally:
        if started_mps:
            stop_mps()
    for end in ends:
        how = "stopped at the deadline" if end.exit_code is None else f"exit {end.exit_code}"
        print(f"shard {end.shard}/{args.shards}: {how} after {end.seconds:.0f} s (log {logs[end.shard - 1]})")
    new = [p.name for p in finished_runs(out) if p.name not in before]
    print(f"finished here: {len(new)} runs: {', '.join(new) or 'none'}")
    if args.pack is not None:
        for path in pack(out, args.pack / "runs.tgz"):
            print(f"packed {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0 if all(end.exit_code == 0 for end in ends) else 1


if __name__ == "__main__":
    sys.exit(main())
