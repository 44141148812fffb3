"""A client's state that notices a deleted version: the server names back the newest state round each client
reported (expect-state), and a client whose newest state file is older or missing refuses the message with an
error naming it, never going on from an older or a fresh state without a word (server_app/state_versions.py,
client_app/app.check_version)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from client_app.state import StateDir
from common.storage.persist import StateFileError
from common.wire.validation import PayloadError
from server_app.state_versions import StateVersions
from server_app.takeover import FRESH_STATE_FILE, allow

from .inprocess import InProcessFederation


class _Device:
    """A device's context: its state under `state-dir`, partition 0 of 2."""

    def __init__(self, root: Path) -> None:
        self.run_config: dict[str, Any] = {"dataset": "digits"}
        self.node_config = {"partition-id": 0, "num-partitions": 2, "state-dir": str(root)}
        self.state = RecordDict()


@pytest.fixture(autouse=True)
def _task_identity() -> None:
    """A message made outside a Flower runtime needs the task identity a ClientApp's process has."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("run_id", "node_id", "task_id"):
        setattr(TaskIdentity, name, 1)


def _message(server_round: int, expect: int | None) -> Message:
    config = ConfigRecord({"server-round": server_round, "state-key": "run-a"})
    if expect is not None:
        config["expect-state"] = expect
    return Message(RecordDict({"config": config}), dst_node_id=1, message_type=MessageType.TRAIN)


def _versions(root: Path, rounds: list[int]) -> StateDir:
    folder = StateDir(root / "run-a" / "partition-0", run="run-a", partition=0)
    for rnd in rounds:
        folder.save(rnd, {"personal": {"w": np.full(3, float(rnd), np.float32)}}, checkpoint_round=0)
    return folder


def _restored(root: Path, server_round: int, expect: int | None) -> float | None:
    from client_app import app as client

    env, _ = client._env(_Device(root), _message(server_round, expect), training=True)  # type: ignore[arg-type]
    arrays = env.state.load_named("personal")
    return None if arrays is None else float(arrays["w"][0])


def test_a_deleted_newest_state_file_is_refused_naming_the_client(tmp_path: Path) -> None:
    folder = _versions(tmp_path, [2, 4])
    assert _restored(tmp_path, 5, 4) == 4.0
    (folder.path / "round-000004.npz").unlink()  # a local account deletes the newest version
    assert _restored(tmp_path, 5, None) == 2.0, "before: the older round's state, without a word"
    with pytest.raises(StateFileError, match=r"client 0: its state of round 4 is missing \(its newest is of round 2\)"):
        _restored(tmp_path, 5, 4)


def test_a_state_folder_emptied_is_not_a_silent_fresh_start(tmp_path: Path) -> None:
    folder = _versions(tmp_path, [3])
    (folder.path / "round-000003.npz").unlink()
    assert _restored(tmp_path, 5, None) is None, "before: a fresh state"
    with pytest.raises(StateFileError, match=r"its state of round 3 is missing \(it has none\)"):
        _restored(tmp_path, 5, 3)


def test_a_newer_state_than_the_server_knows_is_kept(tmp_path: Path) -> None:
    """A straggler saved round 4's state but its reply came late: the server still names round 2; the client goes
    on from round 4's, as a straggler does."""
    _versions(tmp_path, [2, 4])
    assert _restored(tmp_path, 5, 2) == 4.0


def test_the_server_keeps_the_newest_round_each_client_reported() -> None:
    versions = StateVersions()
    versions.note(3, {"state-round": 2}, 2)
    versions.note(3, {"state-round": 1}, 3)  # an evaluation that restored an older one does not lower it
    versions.note(4, {"state-round": -1}, 3)  # holds none
    versions.note(5, {"num-examples": 1}, 3)  # a client of an older version reports nothing
    assert versions.rounds == {3: 2} and versions.instructions(3, 11) == {"expect-state": 2}
    assert versions.instructions(4, 12) == {}
    for bad in (7, -2, "2", 2.0, True):
        with pytest.raises(PayloadError, match="state-round"):
            versions.note(3, {"state-round": bad}, 6)
    versions.forget(3)  # a take-over: the new holder has none of the old one's state
    assert versions.instructions(3, 11) == {}


def test_the_record_goes_in_the_checkpoint_and_a_damaged_one_is_refused() -> None:
    versions = StateVersions()
    versions.note(1, {"state-round": 4}, 4)
    again = StateVersions()
    again.load(versions.state(), checkpoint_round=4)
    assert again.rounds == {1: 4}
    again.load(None, checkpoint_round=4)  # a checkpoint of an older version: nothing to expect
    for bad in ({"1": 5}, {"x": 1}, {"1": "4"}, [1, 4]):
        with pytest.raises(ValueError, match="client-state-rounds"):
            StateVersions().load(bad, checkpoint_round=4)


def test_the_operator_lets_a_holder_whose_state_is_missing_start_afresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    versions = StateVersions(tmp_path)
    versions.note(0, {"state-round": 6}, 6)
    allow(tmp_path, [0], 9, FRESH_STATE_FILE)
    assert versions.instructions(0, 9) == {"expect-state": 6}, "a consent is looked for only after a refusal"
    with caplog.at_level(logging.WARNING, logger="flwr"):
        versions.explain(0, 9, "StateFileError: client 0: its state of round 6 is missing (it has none): ...")
    assert f"pflower allow-takeover {tmp_path} 0 --node 9 --fresh-state" in caplog.text
    allow(tmp_path, [0], 8, FRESH_STATE_FILE)  # the consent for node 9 above was not spent: still there
    assert versions.instructions(0, 7) == {"expect-state": 6}, "a consent names its node"
    assert versions.instructions(0, 9) == {"fresh-state": True}
    assert versions.instructions(0, 9) == {"fresh-state": True}, "again until it answers: a message may be lost"
    versions.note(0, {"state-round": 7}, 7)
    assert versions.instructions(0, 9) == {"expect-state": 7} and versions.rounds == {0: 7}


def test_a_client_told_to_start_afresh_sets_its_state_aside(tmp_path: Path) -> None:
    from client_app import app as client

    _versions(tmp_path, [2])
    message = _message(5, None)
    message.content["config"]["fresh-state"] = True
    env, _ = client._env(_Device(tmp_path), message, training=True)  # type: ignore[arg-type]
    assert env.state.tree == {} and env.state.version is None


def test_every_message_names_the_state_round_the_server_knows() -> None:
    fed = InProcessFederation({"algorithm": "fedper", "dataset": "digits", "fraction-train": 1.0}, 3)
    fed.runner.state_versions.note(1, {"state-round": 0}, 0)
    fed.train_round(1)
    assert fed.sent[1][1]["config"]["expect-state"] == 0
    assert "expect-state" not in fed.sent[1][0]["config"] and "expect-state" not in fed.sent[1][2]["config"]
