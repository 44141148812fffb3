"""Shared fixtures: where the real datasets are, and a skip when they are absent; signing keys kept out of $HOME;
the longest test files scheduled first."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness.schedule import file_seconds, load_durations, longest_first

REPO = Path(__file__).resolve().parent.parent
DURATIONS = Path(__file__).resolve().parent / "durations.json"
_recording = False
_reports: list[tuple[str, float]] = []  # (node id, seconds) of each phase, kept only under --record-durations


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        default=None,
        help="write each test file's seconds (setup, call and teardown summed) to PATH as JSON: tests/durations.json "
        "orders the files, longest first",
    )


def pytest_configure(config: pytest.Config) -> None:
    global _recording
    _recording = bool(config.getoption("--record-durations")) and not hasattr(config, "workerinput")
    # xdist would reorder whole files by their number of tests, which puts the few long end-to-end files last
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = longest_first(items, load_durations(DURATIONS))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _recording:  # in the controller, which sees every worker's reports
        _reports.append((report.nodeid, report.duration))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _recording:
        Path(session.config.getoption("--record-durations")).write_text(
            json.dumps(file_seconds(_reports), indent=1) + "\n"
        )


KEY_DIR_ENV = "PFL_KEY_DIR"  # server_app.checkpoint.KEY_DIR_ENV (not imported: this file stays free of torch/flwr)


@pytest.fixture(scope="session", autouse=True)
def _private_key_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The server's signing key in a temporary folder, never the developer's home: set in os.environ before any
    other fixture, so the simulations and SuperLinks the tests start (module fixtures included) inherit it."""
    previous = os.environ.get(KEY_DIR_ENV)
    os.environ[KEY_DIR_ENV] = str(tmp_path_factory.mktemp("pfl-keys") / "keys")
    yield
    if previous is None:
        os.environ.pop(KEY_DIR_ENV, None)
    else:
        os.environ[KEY_DIR_ENV] = previous


def shared_data_dir() -> Path | None:
    """$PFL_DATA_DIR, else ../shared/data beside the checkout; None when neither holds MNIST."""
    for candidate in (os.environ.get("PFL_DATA_DIR"), REPO.parent / "shared" / "data"):
        if candidate and (Path(candidate) / "MNIST" / "raw").is_dir():
            return Path(candidate).resolve()
    return None


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real-data folder; the test is skipped with the reason when it is missing."""
    found = shared_data_dir()
    if found is None:
        pytest.skip("real datasets not found: set PFL_DATA_DIR or place shared/data beside the checkout")
    return found
