"""Run times of `pflower run` on both engines: the one measured place the docs quote start-up and preset times from.

For each preset and engine, runs `pflower run --preset P --engine E` `--repeats` times (alternating, so every cell
sees the same machine state) and prints, per cell, the median seconds from the command's start to its first round
line (start-up: processes, imports, data, handshake, and round 1) and to its exit (the whole run), with each repeat.
Check the load first: a timing taken beside another run is void.

    python bench/run_times.py                                  # smoke and quickstart, both engines, 3 repeats
    python bench/run_times.py --presets smoke --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def timed_run(preset: str, engine: str, out: Path) -> tuple[float, float]:
    """(seconds to the first round line, seconds to exit) of one `pflower run`."""
    command = [sys.executable, "-m", "experiments.cli", "run", "--preset", preset, "--engine", engine]
    started = time.monotonic()
    first = float("nan")
    process = subprocess.Popen(
        [*command, "--out", str(out)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    tail: list[str] = []
    for line in process.stdout:
        if first != first and "[round 1/" in line:  # NaN until the first round line
            first = time.monotonic() - started
        tail = [*tail[-40:], line]
    if process.wait() != 0:
        sys.exit(f"pflower run --preset {preset} --engine {engine} failed:\n{''.join(tail)}")
    return first, time.monotonic() - started


def main() -> None:
    """Time every preset on every engine and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="smoke,quickstart", help="comma-separated presets")
    parser.add_argument("--engines", default="inprocess,simulation", help="comma-separated engines")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cells = [(p, e) for p in args.presets.split(",") for e in args.engines.split(",")]
    times: dict[tuple[str, str], list[tuple[float, float]]] = {cell: [] for cell in cells}
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            for preset, engine in cells:
                out = Path(folder) / f"{preset}-{engine}-{repeat}"
                times[(preset, engine)].append(timed_run(preset, engine, out))
                first, total = times[(preset, engine)][-1]
                print(f"repeat {repeat + 1}/{args.repeats}: {preset} on {engine}: {first:.1f} s / {total:.1f} s")
    print()
    print("| preset | engine | to the first round line (s, median) | whole run (s, median) | repeats (first / whole) |")
    print("|---|---|---|---|---|")
    for (preset, engine), values in times.items():
        firsts, totals = [v[0] for v in values], [v[1] for v in values]
        each = ", ".join(f"{a:.1f} / {b:.1f}" for a, b in values)
        print(f"| {preset} | {engine} | {statistics.median(firsts):.1f} | {statistics.median(totals):.1f} | {each} |")


if __name__ == "__main__":
    main()
