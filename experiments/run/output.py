"""A run's output: colour codes only on a terminal, Flower's and Ray's known notices only in the log file."""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;]*m")

# Notices that say nothing about the run: Flower's configuration and federation-size advice (the run sets its own
# federation), Ray's deprecation warnings. The run's log file keeps them.
KNOWN_NOTICES = tuple(
    re.compile(pattern)
    for pattern in (
        r"^Flower configuration not found\. Created default configuration at ",
        r"Since flwr 1\.\d+, default simulated SuperNodes changed",
        r"To change federation size, use the following command:",
        r"\bflwr federation simulation-config ",
        r"\bray\b.*FutureWarning|FutureWarning.*\bRay\b",
        r"^\s*warnings\.warn\($",
    )
)


def plain(line: str) -> str:
    """The line without colour codes."""
    return ANSI.sub("", line)


def known_notice(line: str) -> bool:
    """Whether the line is one of Flower's or Ray's known notices (KNOWN_NOTICES)."""
    text = plain(line)
    return any(pattern.search(text) for pattern in KNOWN_NOTICES)


def for_terminal(line: str, is_terminal: bool) -> str | None:
    """The line as the terminal shows it (colours only on a terminal), or None when it is a known notice."""
    if known_notice(line):
        return None
    return line if is_terminal else plain(line)
