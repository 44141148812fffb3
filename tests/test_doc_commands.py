"""Every command the documents quote runs as written: `pflower` subcommands and their options exist, and every
`python <script>.py` names a script of the repository (README.md, docs/, deploy/)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from experiments.cli import parser

from .conftest import REPO

DOCUMENTS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "deploy").glob("*.md")])
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
INLINE = re.compile(r"`([^`]+)`")  # a span may wrap onto the next line


def _code(text: str) -> list[str]:
    """The document's code: each line of its fenced blocks (continuations joined) and each inline span."""
    blocks = FENCE.findall(text)
    spans = [" ".join(s.split()) for s in INLINE.findall(FENCE.sub("", text)) if "\n\n" not in s]
    lines = []
    for block in blocks:
        lines += block.replace("\\\n", " ").splitlines()
    return lines + spans


def _commands(marker: str) -> list[tuple[str, str]]:
    """(document, the command from `marker` on) for every quoted line holding it."""
    found = []
    for doc in DOCUMENTS:
        for line in _code(doc.read_text()):
            for match in re.finditer(rf"(?:^|[\s;&|(]){re.escape(marker)}\s", line):
                found.append((str(doc.relative_to(REPO)), line[match.end() - len(marker) - 1 :].strip()))
    return found


def _options() -> dict[str, set[str]]:
    """Each subcommand's option strings."""
    sub = next(a for a in parser()._actions if a.dest == "command")
    return {name: set(p._option_string_actions) for name, p in sub.choices.items()}  # type: ignore[attr-defined]


def test_every_quoted_pflower_command_and_option_exists() -> None:
    options, bad = _options(), []
    commands = _commands("pflower")
    assert len(commands) > 20, "the documents quote pflower commands"
    for doc, command in commands:
        words = shlex.split(command.split("#")[0].split("|")[0].split("&&")[0], posix=True)
        if len(words) < 2 or words[1].startswith("<"):
            continue
        name = words[1]
        if name not in options:
            bad.append(f"{doc}: `{command}`: no subcommand {name!r}")
            continue
        bad += [
            f"{doc}: `{command}`: `pflower {name}` has no option {w.split('=')[0]}"
            for w in words[2:]
            if w.startswith("--") and w.split("=")[0] not in options[name]
        ]
    assert not bad, "\n".join(bad)


def test_every_quoted_python_script_exists() -> None:
    bad = []
    for doc, command in _commands("python") + _commands("python3"):
        words = command.split()
        script = words[1] if len(words) > 1 else ""
        if script.endswith(".py") and not (REPO / script).is_file():
            bad.append(f"{doc}: `{command}`: no script {script}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("line", ["pflower sweep x.toml --nope", "pflower nope"])
def test_the_check_would_catch_a_stale_command(line: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(f"Run `{line}` and `pflower run --preset smoke`.\n" * 11)
    monkeypatch.setitem(globals(), "DOCUMENTS", [doc])
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    with pytest.raises(AssertionError, match="nope"):
        test_every_quoted_pflower_command_and_option_exists()
