"""Shared fixtures: where the real datasets are, and a skip when they are absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


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
