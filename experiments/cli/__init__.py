"""The `pflower` command line: its parser (parser.py), one handler per subcommand (commands.py), the entry point
(main.py)."""

from .commands import HANDLERS, other_code_runs
from .main import main
from .parser import parser

__all__ = ["HANDLERS", "main", "other_code_runs", "parser"]
