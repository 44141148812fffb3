"""The package layering, read from the source: no import cycles; experiments -> server_app | client_app -> common
(the client never loads the server, neither app loads the experiments, the core loads none of them, and Flower
types enter common/ through one adapter module only); every spec's halves resolve and the round runner and hook
base stay small."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from common.algorithms import SPECS
from common.hparams import describe

from .conftest import REPO

PACKAGES = ("common", "server_app", "client_app", "experiments")
FLOWER_ADAPTER = "common.records"  # the ArrayRecord helpers both halves share


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """Every module (absolute name) an import statement anywhere in the file names, resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{alias.name}" for alias in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {t for t in _imports(name, path) if t in modules and t != name} for name, path in modules.items()}


def test_graph_is_read_from_real_imports() -> None:
    graph = _graph()
    assert "server_app.runner" in graph["server_app.app"]
    assert "server_app.strategies.base" in graph["server_app.strategies.sparse"]  # relative import resolved
    assert "common.config" in graph["client_app.app"]


def test_no_import_cycles() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_layering() -> None:
    modules = _modules()
    for name, path in modules.items():
        imported = _imports(name, path)
        if name.startswith("client_app"):
            assert not any(m.startswith("server_app") for m in imported), f"{name} imports the server app"
        if name.split(".")[0] in ("server_app", "client_app"):
            assert not any(m.split(".")[0] == "experiments" for m in imported), f"{name} imports the experiments"
        if name.startswith("common"):
            assert not any(m.split(".")[0] in ("server_app", "client_app", "experiments") for m in imported), (
                f"{name} imports an app or the experiments"
            )
            if name != FLOWER_ADAPTER:
                assert not any(m == "flwr" or m.startswith("flwr.") for m in imported), (
                    f"{name} imports Flower; only {FLOWER_ADAPTER} may"
                )


def test_every_spec_resolves_to_its_two_halves_and_declares_distinct_keys() -> None:
    from client_app.algorithms import ClientAlgorithm, client_class
    from server_app.strategies import PFLStrategy, strategy_class

    declared: dict[str, object] = {}
    for name, spec in SPECS.items():
        assert issubclass(strategy_class(name), PFLStrategy) and issubclass(client_class(name), ClientAlgorithm)
        for info in describe(spec.params):
            # a key shared by two algorithms must be the very same declaration (one default, one range)
            assert declared.setdefault(info.key, info) == info, f"{info.key} is declared twice differently"


@pytest.mark.parametrize("relative", ["server_app/runner.py", "server_app/strategies/base.py"])
def test_runner_and_hook_base_are_small(relative: str) -> None:
    assert len((REPO / relative).read_text().splitlines()) <= 250


def test_a_spec_naming_a_wrong_class_is_refused() -> None:
    from common.algorithms import resolve_half
    from server_app.strategies import PFLStrategy

    with pytest.raises(TypeError, match="server_app.strategies.fedavg:FedAvgClient is not a PFLStrategy"):
        resolve_half("server_app.strategies", "fedavg:FedAvgClient", PFLStrategy)
    with pytest.raises(ModuleNotFoundError):
        resolve_half("server_app.strategies", "nosuchmodule:X", PFLStrategy)


def test_benchmarks_import_the_installed_package_and_never_the_tests() -> None:
    offenders = []
    for path in sorted((REPO / "bench").rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        imported = _imports(f"bench.{path.stem}", path)
        if any(m == "tests" or m.startswith("tests.") for m in imported):
            offenders.append(f"{path.name} imports the tests")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "insert"
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "path"
            ):
                offenders.append(f"{path.name} edits sys.path")
    assert not offenders, offenders


def test_code_cites_the_papers_not_a_design_document_a_clone_lacks() -> None:
    cited = re.compile(r"\bSPEC(?:\.md)? ?§?\d")
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for folder in (*PACKAGES, "tests", "bench")
        for path in sorted((REPO / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if cited.search(line) and path.name != "test_architecture.py"
    ]
    assert not found, "cite the paper's section instead: " + ", ".join(found)
