"""The names that travel in messages are declared once (common/wire/messages.py): no module of the apps or the core
spells one out where it reads or writes a message's records."""

from __future__ import annotations

import ast
from pathlib import Path

from common.wire.messages import KEYS

from .conftest import REPO

READERS = {"read_count", "read_finite", "read_fraction", "get"}  # calls whose second (get: first) argument is a key
RECORDS = {"ConfigRecord", "MetricRecord", "RecordDict"}  # their dict literal's keys are message names
MESSAGE_NAMES = {
    "config",
    "metrics",
    "node",
    "reply",
    "content",
    "config_records",
    "metric_records",
    "array_records",
    "node_config",
    "instructions",
}


def _literal_keys(tree: ast.AST) -> list[tuple[int, str]]:
    """String literals used as a message name: subscripts of and membership tests on records, `get`s on them,
    the key argument of the readers, and the keys of a record's dict literal."""
    found: list[tuple[int, str]] = []

    def name_of(node: ast.AST) -> str:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            return node.attr
        if isinstance(node, ast.Call):
            return name_of(node.func)
        return ""

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and name_of(node.value) in MESSAGE_NAMES:
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                found.append((node.lineno, node.slice.value))
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            if (
                isinstance(node.left, ast.Constant)
                and isinstance(node.left.value, str)
                and any(name_of(c) in MESSAGE_NAMES for c in node.comparators)
            ):
                found.append((node.lineno, node.left.value))
        elif isinstance(node, ast.Call):
            func = name_of(node.func)
            if func == "get" and isinstance(node.func, ast.Attribute) and name_of(node.func.value) in MESSAGE_NAMES:
                args = node.args[:1]
            elif func in READERS - {"get"}:
                args = node.args[1:2]
            elif func in RECORDS and node.args and isinstance(node.args[0], ast.Dict):
                args = [k for k in node.args[0].keys if k is not None]
            else:
                args = []
            found.extend(
                (node.lineno, a.value) for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)
            )
    return found


def test_the_scan_finds_spelled_out_names() -> None:
    code = (
        'config["prox-mu"] = 1\nread_count(metrics, "num-train")\nx = ConfigRecord({"phase": 2})\n'
        'if "newcomer" in content.config_records: pass\ny = msg.content.config_records.get("config")\n'
    )
    assert sorted(k for _, k in _literal_keys(ast.parse(code))) == [
        "config",
        "newcomer",
        "num-train",
        "phase",
        "prox-mu",
    ]


def test_no_module_spells_out_a_message_name() -> None:
    offenders = []
    for package in ("common", "server_app", "client_app", "experiments/engine"):  # where messages are made and read
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name == "messages.py":
                continue
            for line, key in _literal_keys(ast.parse(path.read_text())):
                if key.startswith("__"):  # common/persist's JSON tree of a state file, not a message
                    continue
                offenders.append(
                    f"{Path(path).relative_to(REPO)}:{line}: {key!r}"
                    + (" (declared in common/wire/messages.py)" if key in KEYS else " (undeclared)")
                )
    assert not offenders, "use the constants of common/wire/messages.py:\n" + "\n".join(offenders)


def test_every_declared_name_is_unique_and_explained() -> None:
    assert all(key.help and key.where for key in KEYS.values())
    assert len({key.name for key in KEYS.values()}) == len(KEYS)
