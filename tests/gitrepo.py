"""A one-commit git checkout for tests of what the CLI records about the code that made a run."""

from __future__ import annotations

import subprocess
from pathlib import Path


def one_commit_checkout(path: Path, more: list[str] | None = None) -> str:
    """`path` made a git checkout with one commit of f.py (and of the `more` files, relative paths); returns its
    short commit."""
    path.mkdir(parents=True, exist_ok=True)
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    for name in ["f.py", *(more or [])]:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text("x = 1\n")
    subprocess.run([*git, "add", "f.py", *(more or [])], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    return subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
