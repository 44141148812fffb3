"""The `pflower` console script: parse, hand the subcommand to its handler, turn a user's mistake into one line."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from common.hparams import ConfigError

from .parser import parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so that everything it started is stopped on the way out."""


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM handler: unwind."""
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `pflower` console script; returns the exit code (0: everything finished)."""
    args = parser().parse_args(argv)
    # imported once the arguments parse: `--help` and a mistyped option never pay for torch and Flower
    from common.data.arrays import DataError

    from .commands import HANDLERS

    # a SIGTERM (`kill`, `timeout`) unwinds as Ctrl+C does, so the run in progress is stopped, not orphaned
    signal.signal(signal.SIGTERM, _terminated)
    try:
        return HANDLERS[args.command](args)
    except (ConfigError, DataError) as exc:
        print(f"pflower: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as exc:
        if isinstance(exc, Terminated):
            print("pflower: terminated; finished runs are kept, the same command resumes the rest", file=sys.stderr)
            return 143
        print("pflower: interrupted; finished runs are kept, the same command resumes the rest", file=sys.stderr)
        return 130
