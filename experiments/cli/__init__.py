"""The `pflower` command line: its parser (parser.py), one handler per subcommand (commands.py), the entry point
(main.py). The handlers are imported when a subcommand runs, so that `pflower --help` answers at once."""

from typing import Any

from .main import main
from .parser import parser

__all__ = ["HANDLERS", "main", "other_code_runs", "parser"]


def __getattr__(name: str) -> Any:
    """HANDLERS and other_code_runs from commands.py, imported on first use."""
    if name in ("HANDLERS", "other_code_runs"):
        from . import commands

        return getattr(commands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
