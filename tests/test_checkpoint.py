"""Server checkpoints: every algorithm, restored from its checkpoint, goes on exactly as the uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.app import RecordDict

from client_app.state import StateDir
from common.algorithms import SPECS
from common.storage.persist import StateFileError
from server_app.checkpoint import KEY_DIR_ENV, Checkpoint, config_differences, load_checkpoint, save_checkpoint

from .inprocess import InProcessFederation

CLIENTS = 4


@pytest.fixture(autouse=True)
def _server_key_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key that signs the checkpoints in a folder of the test's own, not the user's."""
    monkeypatch.setenv(KEY_DIR_ENV, str(tmp_path_factory.mktemp("server-keys")))


def _federation(algorithm: str, state_dir: str, **overrides: str) -> InProcessFederation:
    raw = {
        "algorithm": algorithm,
        "dataset": "digits",
        "num-rounds": 4,
        "fraction-train": 0.5,
        "local-epochs": 1,
        "lr": 0.1,
        "iterations": 1,
        "client-state-dir": state_dir,
        "readjust-interval": 2,
        **overrides,
    }
    return InProcessFederation(raw, CLIENTS)


def _store(tmp_path: Path, pid: int) -> StateDir:
    return StateDir(tmp_path / "clients" / f"partition-{pid}", run="run", partition=pid)


def _flat(content: RecordDict) -> dict:
    out = {f"m:{k}": v for rec in content.metric_records.values() for k, v in rec.items()}
    for key, record in content.array_records.items():
        out.update({f"a:{key}:{name}": array.numpy().tobytes() for name, array in record.items()})
    return out


def _state_bytes(state: dict) -> str:
    def walk(node):
        if isinstance(node, np.ndarray):
            return node.tobytes().hex()
        if isinstance(node, dict):
            return {k: walk(v) for k, v in sorted(node.items())}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    return json.dumps(walk(state), sort_keys=True)


VARIANTS = {"fedamp-lazy-round": ("fedamp", {"pretrain-when": "first-sampled", "fedamp-attend": "round"})}


@pytest.mark.parametrize("algorithm", sorted(SPECS) + sorted(VARIANTS))
def test_resumed_run_continues_exactly(algorithm: str, tmp_path) -> None:
    algorithm, overrides = VARIANTS.get(algorithm, (algorithm, {}))
    fed = _federation(algorithm, str(tmp_path / "clients"), **overrides)
    for rnd in (1, 2):
        fed.train_round(rnd)
    save_checkpoint(tmp_path, Checkpoint(2, fed.strategy.state_dict(), [{"round": 1}, {"round": 2}], 1.5, []))
    for pid, record in fed.states.items():  # what each client wrote to its state dir after round 2
        _store(tmp_path, pid).save(2, record, checkpoint_round=2)
    uninterrupted = [fed.train_round(rnd) for rnd in (3, 4)] + [fed.evaluate(4)]

    resumed = _federation(algorithm, str(tmp_path / "clients"), **overrides)
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint.round == 2 and checkpoint.records == [{"round": 1}, {"round": 2}]
    resumed.strategy.load_state_dict(checkpoint.state)
    for pid in resumed.states:
        loaded = _store(tmp_path, pid).load(3, training=True)
        resumed.set_state(pid, loaded[1] if loaded else {}, server_round=2)
    again = [resumed.train_round(rnd) for rnd in (3, 4)] + [resumed.evaluate(4)]

    for first, second in zip(uninterrupted, again):
        assert sorted(first) == sorted(second)
        for pid in first:
            assert _flat(first[pid]) == _flat(second[pid]), f"client {pid} differs after resuming"
    for rnd in (3, 4):  # the server sends what it would have sent (e.g. DM-PFL's cuts, not whole models)
        assert sorted(fed.sent[rnd]) == sorted(resumed.sent[rnd])
        for pid, content in fed.sent[rnd].items():
            assert _flat(content) == _flat(resumed.sent[rnd][pid]), f"round {rnd}: message to {pid} differs"
    assert _state_bytes(fed.strategy.state_dict()) == _state_bytes(resumed.strategy.state_dict())


def test_checkpoint_of_a_client_models_strategy_holds_the_matrix(tmp_path) -> None:
    fed = _federation("fedamp", "")
    fed.train_round(1)
    save_checkpoint(tmp_path, Checkpoint(1, fed.strategy.state_dict(), [{"round": 1}], 0.0, [1]))
    state = load_checkpoint(tmp_path).state
    matrix = fed.strategy.matrix
    assert np.array_equal(state["matrix"]["W"], matrix.W) and np.array_equal(state["matrix"]["G"], matrix.G)
    assert state["matrix"]["heard"].tolist() == matrix.heard.tolist() and load_checkpoint(tmp_path).resumes == [1]


def test_checkpoint_for_another_model_is_refused(tmp_path) -> None:
    fed = _federation("fedavg", "")
    state = fed.strategy.state_dict()
    state["global"] = state["global"][:-1]
    with pytest.raises(ValueError, match="does not match"):
        _federation("fedavg", "").strategy.load_state_dict(state)


def test_missing_checkpoint_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(StateFileError, match="wrote no checkpoint"):
        load_checkpoint(tmp_path)


def test_resume_may_change_rounds_but_not_what_clients_compute() -> None:
    recorded = {"num-rounds": 10, "lr": 0.05, "results-dir": "/a", "resume": ""}
    assert config_differences(recorded, {**recorded, "num-rounds": 20, "resume": "/a/run"}) == []
    assert config_differences(recorded, {**recorded, "lr": 0.1}) == ["lr"]


def test_a_resumed_client_models_strategy_restores_its_rows_into_the_run_folders_store(tmp_path) -> None:
    fed = _federation("fedamp", "")
    fed.strategy.workdir = tmp_path
    fed.train_round(1)
    save_checkpoint(tmp_path, Checkpoint(1, fed.strategy.state_dict(), [{"round": 1}], 0.0, []))
    resumed = _federation("fedamp", "")
    resumed.strategy.workdir = tmp_path / "resumed"
    resumed.strategy.workdir.mkdir()
    resumed.strategy.load_state_dict(load_checkpoint(tmp_path).state)
    W = resumed.strategy.matrix.W
    assert isinstance(W, np.memmap) and Path(W.filename) == tmp_path / "resumed" / "client-models.npy"
    assert np.array_equal(W, fed.strategy.matrix.W)


def test_the_checkpoint_keeps_each_partitions_node_and_counts(tmp_path) -> None:
    table = {0: (17, 120, 30), 3: (2**64 - 1, 5, 1)}  # Flower's node ids are unsigned 64-bit
    save_checkpoint(tmp_path, Checkpoint(1, {}, [{"round": 1}], 0.0, [], table))
    assert load_checkpoint(tmp_path).clients == table
