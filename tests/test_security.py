"""Attacks on the project replayed (issue: deployment security and client identity): each must now fail."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, RecordDict

from client_app.app import state_dir
from common.config import ConfigError, parse_run_config
from common.validation import PayloadError, is_folder_name


# ----- paths -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../escape", "/etc/cron.d", "a/b", ".hidden", "..", "x" * 101, "tab\tname", "é"])
def test_run_name_cannot_leave_the_results_folder(name: str) -> None:
    with pytest.raises(ConfigError, match="'run-name' .* must be a folder name"):
        parse_run_config({"run-name": name})


def test_plain_run_names_are_kept() -> None:
    assert parse_run_config({"run-name": "fedavg-mnist_seed.1"}).run_name == "fedavg-mnist_seed.1"
    assert parse_run_config({}).run_name == ""


@pytest.mark.parametrize("key", ["../../outside", "/tmp/elsewhere", "..", "run/../../x"])
def test_a_server_sent_state_key_is_never_used_as_a_path(tmp_path, key: str) -> None:
    class Context:
        node_config = {"partition-id": 0, "num-partitions": 2, "state-dir": str(tmp_path / "state")}

    class Msg:
        content = RecordDict({"config": ConfigRecord({"server-round": 1, "state-key": key})})

    victim = tmp_path / "outside"
    victim.write_text("keep me")
    with pytest.raises(PayloadError, match="state-key"):
        state_dir(Context(), Msg(), parse_run_config({}))
    assert victim.read_text() == "keep me"
    assert not is_folder_name(key) and is_folder_name("fedavg-digits-20261124-101010")
