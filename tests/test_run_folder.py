"""The run folder: common/run_folder.py declares its files and reads and writes them; no other module spells out a
file name of it, and what a writer writes its reader reads back."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from common.persist import CHECKPOINT_FILE
from common.run_folder import ARTIFACTS_FILE, RUN_FILES, RunFolder

from .conftest import REPO

DECLARED = (*RUN_FILES, CHECKPOINT_FILE)
DECLARING = {"common/run_folder.py", "common/persist.py"}


def _spelled_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, file name) of every string in the code, docstrings aside, that names a run folder's file."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, name)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        for name in DECLARED
        if name in node.value
    ]


def test_the_scan_finds_spelled_out_file_names_but_not_docstrings() -> None:
    code = '"""Reads summary.json."""\nx = run / "config.json"\ny = f"no {a} in metrics.jsonl"\n'
    assert sorted(name for _, name in _spelled_names(ast.parse(code))) == ["config.json", "metrics.jsonl"]


def test_no_module_spells_out_a_run_folder_file() -> None:
    offenders = [
        f"{path.relative_to(REPO)}:{line}: {name!r}"
        for package in ("common", "server_app", "client_app", "experiments", "bench")
        for path in sorted((REPO / package).rglob("*.py"))
        if path.relative_to(REPO).as_posix() not in DECLARING
        for line, name in _spelled_names(ast.parse(path.read_text()))
    ]
    assert not offenders, "use common/run_folder.py:\n" + "\n".join(offenders)


def test_what_the_folder_writes_it_reads_back(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "run")
    folder.path.mkdir()
    assert not folder.is_run() and not folder.finished() and not folder.resumable() and folder.rounds() == []
    folder.write_config({"algorithm": "fedavg", "lr": 0.05})
    folder.write_rounds([{"round": 1, "loss": 2.5}])
    folder.append_round({"round": 2, "eval": {"mean": {"0": 0.5}}})
    folder.append_digests([{"round": 2, "kind": "train", "client": 0, "digest": "ab"}])
    folder.write_artifacts({"attention": np.eye(2)})
    markdown = folder.write_summary({"final": {"mean": 0.5}}, "# run\n")
    assert folder.is_run() and folder.finished() and markdown.read_text() == "# run\n"
    assert folder.config() == {"algorithm": "fedavg", "lr": 0.05}
    assert folder.rounds() == [{"round": 1, "loss": 2.5}, {"round": 2, "eval": {"mean": {"0": 0.5}}}]
    assert folder.digests() == [{"client": 0, "digest": "ab", "kind": "train", "round": 2}]
    assert folder.summary() == {"final": {"mean": 0.5}}
    np.testing.assert_array_equal(folder.artifacts()["attention"], np.eye(2))
    folder.write_rounds([{"round": 1, "loss": 2.5}])  # a resumed run keeps its checkpointed rounds only
    assert [r["round"] for r in folder.rounds()] == [1]


def test_artifacts_are_never_unpickled(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    np.savez(folder.file(ARTIFACTS_FILE), objects=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="pickle"):
        folder.artifacts()
