"""The package layering, read from the source: no import cycles; experiments -> server_app | client_app -> common
(the client never loads the server, neither app loads the experiments, the core loads none of them, and Flower
types enter common/ through one adapter module only); every spec's halves resolve; each part of the server imports
only what it may and only the exchange loop talks to the grid."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from common.algorithms import SPECS
from common.hparams import describe

from .conftest import REPO

PACKAGES = ("common", "server_app", "client_app", "experiments")
FLOWER_ADAPTER = "common.wire.records"  # the ArrayRecord helpers both halves share
# Flower's secure-aggregation primitives (key agreement, Shamir, Fernet): plain crypto functions, used by SecAgg+'s core
FLOWER_CRYPTO = ("flwr.common.secure_aggregation", "flwr.supercore.primitives")
CRYPTO_USERS = ("common.secagg.protocol",)


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
                crypto = FLOWER_CRYPTO if name in CRYPTO_USERS else ()
                flower = [m for m in imported if (m == "flwr" or m.startswith("flwr.")) and not m.startswith(crypto)]
                assert not flower, f"{name} imports Flower ({flower}); only {FLOWER_ADAPTER} may"


def test_the_core_reads_sections_not_the_run_config() -> None:
    """Below the run config, common/ takes the sections it needs (common/sections.py, common/data/settings.py):
    no module of it imports the whole config but the config itself."""
    graph = _graph()
    offenders = sorted(
        m for m in graph if m.startswith("common.") and m != "common.config" and "common.config" in graph[m]
    )
    assert not offenders, offenders
    assert "common.sections" in graph["common.config"]  # the run config builds the sections


def test_every_spec_resolves_to_its_two_halves_and_declares_distinct_keys() -> None:
    from client_app.algorithms import ClientAlgorithm, client_class
    from server_app.strategies import PFLStrategy, strategy_class

    declared: dict[str, object] = {}
    for name, spec in SPECS.items():
        assert issubclass(strategy_class(name), PFLStrategy) and issubclass(client_class(name), ClientAlgorithm)
        for info in describe(spec.params):
            # a key shared by two algorithms must be the very same declaration (one default, one range)
            assert declared.setdefault(info.key, info) == info, f"{info.key} is declared twice differently"


# What each part of the server app may import of it: the runner drives the phases; the exchange loop, the phases
# (pre-training, newcomers), an algorithm's hooks and the results writer never reach back into the runner, and only
# the ServerApp builds a runner. The first matching prefix rules; None: any module of the server app.
SERVER_IMPORTS: list[tuple[str, tuple[str, ...] | None]] = [
    ("server_app.app", None),
    (
        "server_app.runner",
        (
            "server_app.checkpoint",
            "server_app.clients",
            "server_app.exchange",
            "server_app.faults",
            "server_app.limits",
            "server_app.newcomers",
            "server_app.plateau",
            "server_app.replies",
            "server_app.results",
            "server_app.secure",
            "server_app.state_versions",
            "server_app.strategies.base",
            "server_app.warmup",
        ),
    ),
    ("server_app.checkpoint", ("server_app.clients", "server_app.results", "server_app.strategies.base")),
    ("server_app.strategies", ("server_app.strategies", "server_app.clients", "server_app.replies")),
    ("server_app.results", ("server_app.results", "server_app.replies")),
    ("server_app.warmup", ("server_app.replies",)),
    # SecAgg+'s stages: through the exchange loop and the reply checks, on the runner's hooks (a Protocol of them)
    (
        "server_app.secure",
        (
            "server_app.clients",
            "server_app.exchange",
            "server_app.limits",
            "server_app.replies",
            "server_app.strategies.base",
        ),
    ),
    ("server_app.newcomers", ("server_app.replies",)),
    ("server_app.clients", ("server_app.exchange", "server_app.takeover")),
    ("server_app.state_versions", ("server_app.takeover",)),  # the operator's fresh-state consent
    ("server_app.replies", ("server_app.wire",)),
    ("server_app.linkguard", ("server_app.executor_watch",)),  # pflower-superlink installs the executor's watch
    ("server_app", ()),  # the exchange loop, faults, limits, plateau, take-over, wire format, Flower's internals
]


def _allowed(module: str) -> tuple[str, ...] | None:
    return next(allowed for prefix, allowed in SERVER_IMPORTS if module == prefix or module.startswith(prefix + "."))


def _server_violations(graph: dict[str, set[str]]) -> list[str]:
    offenders = []
    for module, imported in sorted(graph.items()):
        if not module.startswith("server_app.") or (allowed := _allowed(module)) is None:
            continue
        for target in sorted(t for t in imported if t.startswith("server_app.") and t != module):
            if not any(target == a or target.startswith(a + ".") for a in allowed):
                offenders.append(f"{module} imports {target}")
    return offenders


def test_each_part_of_the_server_imports_only_what_it_may() -> None:
    assert not _server_violations(_graph())


def test_the_rules_catch_a_phase_or_a_hook_reaching_into_the_runner() -> None:
    made_up = {
        "server_app.warmup": {"server_app.runner", "server_app.replies"},
        "server_app.strategies.dmpfl": {"server_app.exchange", "server_app.strategies.sparse"},
        "server_app.exchange": {"server_app.clients"},
        "server_app.app": {"server_app.runner"},
    }
    assert _server_violations(made_up) == [
        "server_app.exchange imports server_app.clients",
        "server_app.strategies.dmpfl imports server_app.exchange",
        "server_app.warmup imports server_app.runner",
    ]


def test_only_the_exchange_loop_talks_to_the_grid() -> None:
    """Messages go out and replies come in through server_app/exchange.py alone."""
    calls = {"push_messages", "pull_messages", "send_and_receive"}
    offenders = [
        f"{path.relative_to(REPO)}:{node.lineno}"
        for path in sorted((REPO / "server_app").rglob("*.py"))
        if path.name != "exchange.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in calls
    ]
    assert not offenders, offenders


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
