"""The run folder: common/storage/run_folder.py declares its files and reads and writes them; no other module spells
out a file name of it, and what a writer writes its reader reads back."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from common.storage.persist import CHECKPOINT_FILE
from common.storage.run_folder import (
    ARTIFACTS_FILE,
    RUN_FILES,
    RoundRecord,
    RunFolder,
    Summary,
    evaluated_clients,
    evaluation,
    evaluation_means,
    final_evaluation,
    final_means,
    final_stds,
    unseen_evaluation,
    unseen_means,
)

from .conftest import REPO

DECLARED = (*RUN_FILES, CHECKPOINT_FILE)
DECLARING = {"common/storage/run_folder.py", "common/storage/persist.py"}


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


def _offenders(scan: Callable[[ast.AST], list[tuple[int, str]]], exempt: set[str]) -> list[str]:
    """`path:line: finding` for every finding of `scan(tree)` in the packages and benchmarks, `exempt` files aside."""
    return [
        f"{path.relative_to(REPO)}:{line}: {found!r}"
        for package in ("common", "server_app", "client_app", "experiments", "bench")
        for path in sorted((REPO / package).rglob("*.py"))
        if path.relative_to(REPO).as_posix() not in exempt
        for line, found in scan(ast.parse(path.read_text()))
    ]


def test_no_module_spells_out_a_run_folder_file() -> None:
    offenders = _offenders(_spelled_names, DECLARING)
    assert not offenders, "use common/storage/run_folder.py:\n" + "\n".join(offenders)


EVALUATION_KEYS = ("final", "eval", "unseen")  # the records' evaluations, read through run_folder's accessors
WRITERS = {"common/storage/run_folder.py", "server_app/results/summary.py", "server_app/results/log_lines.py"}


def _read_keys(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, key) of every evaluation key read by subscript or `.get` with a literal."""
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            key = node.args[0].value
        if key in EVALUATION_KEYS:
            found.append((node.lineno, str(key)))
    return found


def test_the_scan_finds_evaluations_read_by_hand() -> None:
    code = 'a = s["final"]["mean"]\nb = (s.get("final") or {}).get("mean")\nc = r.get("eval")\nd = x["finale"]\n'
    assert sorted(key for _, key in _read_keys(ast.parse(code))) == ["eval", "final", "final"]


def test_no_reader_reads_an_evaluation_by_hand() -> None:
    offenders = _offenders(_read_keys, WRITERS)
    assert not offenders, "read them with common/storage/run_folder.py's accessors:\n" + "\n".join(offenders)


def test_the_accessors_read_the_evaluations_and_give_empty_answers_without_one() -> None:
    evaluated: RoundRecord = {
        "round": 3,
        "wall_s": 1.0,
        "elapsed_s": 3.0,
        "train": {},
        "bytes": {},
        "bytes_per_client": {},
        "eval": {"num_clients": 4, "failed": 0, "mean": {"acc": 0.5}, "std": {"acc": 0.1}, "per_client": {}},
    }
    plain: RoundRecord = {**evaluated, "eval": None}
    assert evaluation_means(evaluated) == {"acc": 0.5} and evaluated_clients(evaluated) == 4
    assert evaluation(plain) is None and evaluation_means(plain) == {} and evaluated_clients(plain) == 0
    unseen = {"num_clients": 2, "failed": 1, "mean": {"acc": 0.3}, "std": {"acc": 0.0}, "per_client": {}}
    summary: Summary = {"final": {"mean": {"acc": 0.5}, "std": {"acc": 0.1}, "num_clients": 4}, "unseen": unseen}
    assert final_means(summary) == {"acc": 0.5} and final_stds(summary) == {"acc": 0.1}
    assert unseen_means(summary) == {"acc": 0.3} and unseen_evaluation(summary) == unseen
    never: Summary = {"final": None}
    assert final_evaluation(never) is None and final_means(never) == {} and final_stds(never) == {}
    assert unseen_evaluation(never) is None and unseen_means(never) == {}


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
