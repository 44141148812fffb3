"""Where a simulated client keeps its state: `auto` in the run folder (memory where that cannot be written),
`memory`, a named folder, or a device's node-config state-dir; each signed for the run and partition."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from flwr.app import ConfigRecord, RecordDict

from client_app.app import state_dir
from client_app.state import StateDir
from common.config import parse_run_config


def _store(tmp: Path, node: dict, **config: object) -> StateDir | None:
    cfg = parse_run_config({"results-dir": str(tmp / "results"), **config})
    context = SimpleNamespace(node_config={"partition-id": 3, "num-partitions": 5, **node})
    msg = SimpleNamespace(content=RecordDict({"config": ConfigRecord({"state-key": "run-a"})}))
    return state_dir(context, msg, cfg.output)  # type: ignore[arg-type]


def _call(tmp: Path, node: dict, **config: object) -> Path | None:
    found = _store(tmp, node, **config)
    return None if found is None else found.path


def test_auto_is_the_run_folder_and_nothing_is_made_before_a_save(tmp_path: Path) -> None:
    assert _call(tmp_path, {}) == tmp_path / "results" / "run-a" / "client-state" / "partition-3"
    assert not (tmp_path / "results").exists()
    resumed = tmp_path / "elsewhere" / "run-a"
    assert _call(tmp_path, {}, resume=str(resumed)) == resumed / "client-state" / "partition-3"


def test_memory_a_folder_and_a_devices_state_dir(tmp_path: Path) -> None:
    assert _call(tmp_path, {}, **{"client-state-dir": "memory"}) is None
    assert _call(tmp_path, {}, **{"client-state-dir": str(tmp_path / "s")}) == tmp_path / "s" / "run-a" / "partition-3"
    assert _call(tmp_path, {"state-dir": str(tmp_path / "dev")}) == tmp_path / "dev" / "run-a" / "partition-3"


def test_auto_falls_back_to_memory_where_the_run_folder_is_not_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Path] = []

    def no_write(path: object, mode: int) -> bool:
        asked.append(Path(str(path)))
        return False

    monkeypatch.setattr(os, "access", no_write)  # as for a user without rights there (root may write anywhere)
    assert _call(tmp_path, {}) is None
    assert asked == [tmp_path]  # the nearest folder that exists is the one checked


@pytest.mark.parametrize("where", ["auto", "folder", "device"])
def test_the_state_is_signed_for_the_run_and_partition_the_server_and_node_name(tmp_path: Path, where: str) -> None:
    node = {"state-dir": str(tmp_path / "dev")} if where == "device" else {}
    config = {"client-state-dir": str(tmp_path / "s")} if where == "folder" else {}
    found = _store(tmp_path, node, **config)
    assert found is not None and (found.run, found.partition) == ("run-a", 3)
