"""The seams where a runtime meets the apps, each an interface chosen in one place: the client state stores, the
runner's checkpoint callback, the data source, and the one adapter that touches Flower's internals."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from flwr.app import RecordDict

from client_app.state import (
    ClientState,
    Kept,
    NodeContextStore,
    RuntimeStore,
    StateDir,
    StateDirStore,
    StateHost,
    host_state,
    pick_store,
)
from common.config import parse_run_config
from common.data.arrays import DataError
from common.data.datasets import load_dataset, use_data_source
from common.storage.run_folder import RunFolder

from .conftest import REPO
from .fakes import hand_made_runner


def _changed(value: float) -> ClientState:
    state = ClientState()
    state.save_named("alpha", {"alpha": np.array([value], np.float32)})
    return state


def test_the_store_is_the_runtime_when_one_hosts_the_client_else_the_state_dir_else_the_node_context(
    tmp_path: Path,
) -> None:
    folder = StateDir(tmp_path / "p0", run="run-a", partition=0)
    context = RecordDict()
    assert isinstance(pick_store(None, context), NodeContextStore)
    assert isinstance(pick_store(folder, context), StateDirStore)
    host = StateHost()
    host_state(host)
    try:
        store = pick_store(folder, context)
        assert isinstance(store, RuntimeStore) and store.folder is folder and store.host is host
    finally:
        host_state(None)
    assert isinstance(pick_store(folder, context), StateDirStore)


def test_the_node_context_and_state_dir_stores_give_back_what_a_message_left(tmp_path: Path) -> None:
    context = RecordDict()
    NodeContextStore(context).persist(_changed(2.5), 3, None, due=False)
    assert NodeContextStore(context).restore(4, training=True).tree["alpha"]["alpha"][0] == 2.5

    store = StateDirStore(StateDir(tmp_path / "p0", run="run-a", partition=0))
    store.persist(_changed(4.0), 3, None, due=False)
    assert store.folder.versions() == [3]
    assert store.restore(4, training=True).tree["alpha"]["alpha"][0] == 4.0
    assert store.restore(3, training=True).tree == {}  # a training message of round 3 reads an earlier round's


def test_the_runtime_store_keeps_the_state_in_memory_and_writes_it_only_in_a_checkpointed_round(
    tmp_path: Path,
) -> None:
    host = StateHost()
    store = RuntimeStore(host, StateDir(tmp_path / "p0", run="run-a", partition=0))
    host.begin(Kept(2, {"alpha": {"alpha": np.array([1.0])}}, None, None, dirty=False))
    assert store.restore(3, training=True).tree["alpha"]["alpha"][0] == 1.0
    assert store.restore(2, training=True).tree == {}  # round 2's state is not an earlier round's: disk (none)
    store.persist(_changed(7.0), 3, None, due=False)
    assert host.outgoing is not None and host.outgoing.dirty and store.folder is not None
    assert store.folder.versions() == []
    store.persist(_changed(8.0), 4, None, due=True)
    assert store.folder.versions() == [4] and host.outgoing is not None and not host.outgoing.dirty


def test_the_runner_calls_its_checkpoint_callback_before_each_checkpoint_with_the_one_before(tmp_path: Path) -> None:
    from server_app.results import ResultsWriter

    cfg = parse_run_config({"checkpoint-every": 2, "num-rounds": 6})
    runner = hand_made_runner(cfg, [], [np.zeros(2, np.float32)], {0: 10})
    runner.writer = ResultsWriter(tmp_path, cfg.to_dict())
    seen: list[tuple[int | None, bool]] = []
    runner.before_checkpoint = lambda last: seen.append((last, RunFolder(tmp_path).resumable()))
    for server_round in range(1, 5):
        runner.write_checkpoint(server_round, 1.0, cfg.num_rounds)
    assert seen == [(0, False), (2, True)]  # rounds 2 and 4 only, each before its own checkpoint is written
    assert runner.checkpoint_round == 4


def test_a_data_source_answers_every_load_of_the_process_until_it_is_removed() -> None:
    digits = load_dataset("digits", "/nonexistent")

    def source(name: str):  # type: ignore[no-untyped-def]
        if name != "mnist":
            raise DataError(f"this source holds mnist, not {name}")
        return digits

    use_data_source(source)
    try:
        assert load_dataset("mnist", "/nonexistent") is digits  # no files read
        with pytest.raises(DataError, match="holds mnist, not cifar10"):
            load_dataset("cifar10", "/nonexistent")
    finally:
        use_data_source(None)
    with pytest.raises(DataError):
        load_dataset("mnist", "/nonexistent")


FLOWER_INTERNALS = ("TaskIdentity", "InMemoryLinkState", "metadata.__dict__")


def test_only_the_adapter_touches_flowers_internals() -> None:
    """Flower's private fields, task identity and link state appear in one module of the packages."""
    offenders = []
    for package in ("common", "server_app", "client_app", "experiments"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name == "flower_private.py":
                continue
            source = ast.unparse(ast.parse(path.read_text()))  # code, not comments or docstrings' layout
            offenders += [f"{path.relative_to(REPO)}: {name}" for name in FLOWER_INTERNALS if name in source]
    assert not offenders, offenders
