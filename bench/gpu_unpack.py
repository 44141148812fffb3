"""Back from a GPU machine: join the runs.tgz parts that bench/gpu_sweep.py --pack wrote, check the whole against
runs.sha256 before anything is extracted (an old archive's parts, or a missing one, are refused), and unpack the
finished runs into the sweep's results folder; then `pflower sweep FILE --budget 10m --commit` lands their records.

    python bench/gpu_unpack.py RETURNED_DIR --into results/NAME
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments.run.side_by_side import unpack


def main(argv: list[str] | None = None) -> int:
    """Unpack; 0 when the archive matched its checksum, 2 when it did not (one line why)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="the folder that came back (it holds runs.tgz or its parts)")
    parser.add_argument("--into", type=Path, required=True, help="the sweep's results folder, e.g. results/NAME")
    args = parser.parse_args(argv)
    try:
        members = unpack(args.folder / "runs.tgz", args.into)
    except (OSError, ValueError) as exc:
        print(f"gpu_unpack: {exc}", file=sys.stderr)
        return 2
    print(f"unpacked {members} files and folders into {args.into}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
