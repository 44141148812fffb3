"""A run's results: its folder and files (folder.py), log lines (log_lines.py), summary (summary.py), summary.md
(markdown.py), figures (plots.py) and shift tables (shift.py)."""

from .folder import ResultsWriter, make_run_dir, read_run_config
from .log_lines import progress_text, round_record, settings_text
from .markdown import render_markdown
from .summary import summarize

__all__ = [
    "ResultsWriter",
    "make_run_dir",
    "progress_text",
    "read_run_config",
    "render_markdown",
    "round_record",
    "settings_text",
    "summarize",
]
