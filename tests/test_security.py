"""Attacks on the project replayed (issue: deployment security and client identity): each must now fail."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, RecordDict

from client_app.app import state_dir
from common.config import ConfigError, parse_run_config
from common.wire.validation import PayloadError, is_folder_name


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
        state_dir(Context(), Msg(), parse_run_config({}).output)
    assert victim.read_text() == "keep me"
    assert not is_folder_name(key) and is_folder_name("fedavg-digits-20261124-101010")


# ----- key files ---------------------------------------------------------------------------------------
def test_private_keys_are_0600_and_folders_0700_whatever_the_umask_or_leftovers(tmp_path) -> None:
    import os
    import stat
    import subprocess
    import sys

    from .conftest import REPO

    out = tmp_path / "certs"
    out.mkdir(mode=0o777)
    os.chmod(out, 0o777)
    stale = out / "ca.key.tmp"
    stale.write_bytes(b"stale")
    os.chmod(stale, 0o644)
    script = (
        f"import os, runpy, sys; os.umask(0); sys.argv = ['generate_certs.py', '--out', {str(out)!r}, "
        f"'--nodes', 'node-0']; runpy.run_path({str(REPO / 'deploy' / 'generate_certs.py')!r}, "
        "run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    def mode(path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    for private in (out / "ca.key", out / "server.key", out / "nodes" / "node-0"):
        assert mode(private) == 0o600, private
    assert mode(out) == 0o700 and mode(out / "nodes") == 0o700
    assert not stale.exists()


# ----- pickles --------------------------------------------------------------------------------------------
def test_a_planted_cifar_pickle_is_refused_before_it_runs(tmp_path) -> None:
    import pickle

    from common.data.datasets import DataError, load_dataset

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    for name in ("data_batch_1", "test_batch", "batches.meta"):
        (folder / name).write_bytes(pickle.dumps({"data": Payload(), "labels": [0]}))
    with pytest.raises(DataError, match="refusing to unpickle"):
        load_dataset("cifar10", str(tmp_path))
    assert not marker.exists(), "the planted pickle never ran"


def test_the_staged_cifar_subset_still_verifies(data_dir) -> None:
    from common.data.datasets import verify_cifar_file

    folder = data_dir / "cifar-10-batches-py"
    if not folder.is_dir():
        pytest.skip("CIFAR-10 subset not staged")
    for path in sorted(folder.iterdir()):
        verify_cifar_file(path)


# ----- declared sample counts ------------------------------------------------------------------------------
def test_a_reply_cannot_count_more_samples_than_its_client_declared(caplog) -> None:
    import logging

    import numpy as np

    from .fakes import FakeReply, hand_made_runner, train_content

    specs = [("body.w", (2,))]
    runner = hand_made_runner(parse_run_config({}), specs, [np.zeros(2, np.float32)], {0: 100, 1: 100})
    honest = FakeReply(100, train_content(["body.w"], [np.full(2, 1.0, np.float32)], 100))
    attacker = FakeReply(101, train_content(["body.w"], [np.full(2, 1e5, np.float32)], 10**9))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        runner.aggregate_train(1, [honest, attacker])
    assert runner.round_log.train["rejected"] == 1
    assert "num-examples = 1000000000 exceeds the 100 training samples the client declared" in caplog.text
    np.testing.assert_array_equal(runner.strategy.global_arrays[0], [1.0, 1.0])  # the attacker is not the model


def test_the_handshake_refuses_counts_above_the_configured_bound(monkeypatch, caplog) -> None:
    import logging

    from flwr.app import MetricRecord

    from server_app import clients as clients_module
    from server_app.clients import ClientRegistry

    from .fakes import BlockingGrid, FakeReply

    class Grid(BlockingGrid):
        def get_node_ids(self):
            return [1, 2]

        def send_and_receive(self, messages, timeout):
            counts = {1: 500, 2: 10**8}
            return [
                FakeReply(
                    m.dst_node_id,
                    RecordDict(
                        {
                            "metrics": MetricRecord(
                                {
                                    "partition-id": m.dst_node_id - 1,
                                    "num-partitions": 2,
                                    "num-train": counts[m.dst_node_id],
                                    "num-test": 10,
                                }
                            )
                        }
                    ),
                )
                for m in messages
            ]

    class Message:  # a stand-in: Flower's Message needs a running app's identity
        def __init__(self, content, dst_node_id, message_type):
            self.dst_node_id = dst_node_id

    monkeypatch.setattr(clients_module, "Message", Message)
    registry = ClientRegistry(max_samples=100_000)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        registry.handshake(Grid(), timeout=5)
    assert registry.ids() == [0] and registry.total_train() == 500
    assert (
        "node 2: handshake rejected: declares 100000000 training and 10 test samples, above max-client-samples"
        in caplog.text
    )


# ----- wrong-phase uploads ---------------------------------------------------------------------------------
def test_a_phase_one_upload_is_refused_in_phase_two(caplog) -> None:
    import logging

    import numpy as np

    from .fakes import FakeReply
    from .inprocess import InProcessFederation

    raw = {
        "algorithm": "dmpfl",
        "dataset": "digits",
        "num-rounds": 3,
        "iterations": 1,
        "fraction-train": 1.0,
        "local-epochs": 1,
    }
    fed = InProcessFederation(raw, 2)
    phase_one = fed.train_round(1)  # uploads carry each client's own mask (bits + values)
    assert fed.strategy.phase(2) == 2
    before = [a.copy() for a in fed.strategy.global_arrays]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        fed.runner.aggregate_train(2, [FakeReply(1000 + pid, reply) for pid, reply in phase_one.items()])
    assert fed.round_log.train["rejected"] == 2 and fed.round_log.train["used"] == 0
    assert "carries its own mask" in caplog.text
    assert all(np.array_equal(a, b) for a, b in zip(before, fed.strategy.global_arrays))


# ----- cost of a reply ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind", ["metrics", "arrays", "bytes", "config-entries", "config-bytes", "metric-key", "array-key"]
)
def test_oversized_replies_are_refused_before_decoding_or_counting(monkeypatch, caplog, kind: str) -> None:
    import logging

    import numpy as np
    from flwr.app import Array, ArrayRecord, MetricRecord

    from .fakes import FakeReply, hand_made_runner, train_content

    specs = [("body.w", (2,))]
    runner = hand_made_runner(parse_run_config({}), specs, [np.zeros(2, np.float32)], {0: 10, 1: 10})
    bad = train_content(["body.w"], [np.ones(2, np.float32)], 10)
    if kind == "metrics":
        bad["metrics"] = MetricRecord({f"m{i}": 0.0 for i in range(20_000)} | {"num-examples": 10, "train-loss": 0.1})
    elif kind == "arrays":
        bad["arrays"] = ArrayRecord({f"junk{i}": Array(np.zeros(1, np.float32)) for i in range(10_000)})
    elif kind == "bytes":
        bad["arrays"] = ArrayRecord({"body.w": Array(np.zeros(1_000_000, np.float32))})
    elif kind == "config-entries":  # 200,000 entries: refused by their count, before any is looked at
        bad["extra"] = ConfigRecord({f"c{i}": i for i in range(200_000)})
    elif kind == "config-bytes":
        bad["extra"] = ConfigRecord({"blob": b"x" * 40_000_000})
    elif kind == "metric-key":
        bad["metrics"]["k" * 1_000_000] = 1.0
    else:
        bad["arrays"] = ArrayRecord({"body.w" + "x" * 100_000: Array(np.ones(2, np.float32))})
    counted = []
    import server_app.replies as replies_module

    real = replies_module.wire_bytes
    monkeypatch.setattr(replies_module, "wire_bytes", lambda msg: counted.append(msg) or real(msg))
    good = FakeReply(100, train_content(["body.w"], [np.ones(2, np.float32)], 10))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        runner.aggregate_train(1, [good, FakeReply(101, bad)])
    assert runner.round_log.train["rejected"] == 1 and runner.round_log.train["used"] == 1
    assert "client 1: reply refused before decoding" in caplog.text
    assert len(counted) == 1, "the oversized reply was never re-serialized to count its bytes"


def test_a_reply_with_too_many_config_entries_is_refused_by_its_count_alone() -> None:
    import numpy as np

    from server_app.limits import ReplyLimits

    from .fakes import train_content

    class Untouchable(ConfigRecord):
        def values(self):  # type: ignore[override]
            raise AssertionError("the check looked at the entries one by one")

        def keys(self):  # type: ignore[override]
            raise AssertionError("the check looked at the keys one by one")

    content = train_content(["body.w"], [np.ones(2, np.float32)], 10)
    content["extra"] = Untouchable({f"c{i}": i for i in range(200_000)})
    with pytest.raises(PayloadError, match="200000 config entries, more than the 64"):
        ReplyLimits.for_model([("body.w", (2,))]).check(content)


# ----- checkpoints ------------------------------------------------------------------------------------------
def _fedamp_checkpoint_state():
    from .inprocess import InProcessFederation

    raw = {"algorithm": "fedamp", "dataset": "digits", "fraction-train": 1.0, "local-epochs": 1}
    fed = InProcessFederation(raw, 3)
    fed.train_round(1)
    return fed, fed.strategy.state_dict()


def _damage(state: dict, how: str) -> None:
    import numpy as np

    matrix = state["matrix"]
    if how == "nan-model":
        state["global"][0] = np.full_like(state["global"][0], np.nan)
    elif how == "nan-row":
        matrix["W"] = matrix["W"].copy()
        matrix["W"][1, 0] = np.nan
    elif how == "zeroed-gram":
        matrix["G"] = np.zeros_like(matrix["G"])
    elif how == "wrong-width":
        matrix["W"] = matrix["W"][:, :-3]
    elif how == "missing-key":
        del state["matrix"]["heard"]


@pytest.mark.parametrize("how", ["nan-model", "nan-row", "zeroed-gram", "wrong-width", "missing-key"])
def test_a_well_formed_but_bad_checkpoint_is_refused_in_one_line(tmp_path, how: str) -> None:
    from server_app.checkpoint import Checkpoint, load_checkpoint, restore, save_checkpoint
    from server_app.clients import RunAborted

    fed, state = _fedamp_checkpoint_state()
    _damage(state, how)
    save_checkpoint(tmp_path, Checkpoint(1, state, [{"round": 1}], 1.0, []))
    fresh, _ = _fedamp_checkpoint_state()
    with pytest.raises(RunAborted, match="cannot resume from the checkpoint") as info:
        restore(fresh.strategy, None, load_checkpoint(tmp_path))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("round_", "records"), [(-5, []), (0, []), (3, [{"round": 1}]), (1, [{"r": 1}])])
def test_a_checkpoint_with_impossible_rounds_is_refused(tmp_path, round_: int, records: list) -> None:
    from common.storage.persist import StateFileError
    from server_app.checkpoint import Checkpoint, load_checkpoint, save_checkpoint

    save_checkpoint(tmp_path, Checkpoint(round_, {"global": []}, records, 1.0, []))
    with pytest.raises(StateFileError, match="damaged checkpoint"):
        load_checkpoint(tmp_path)


def test_a_checkpoint_with_a_broken_record_list_is_refused(tmp_path, monkeypatch) -> None:
    from common.storage.persist import StateFileError, save_tree, signing_key
    from server_app.checkpoint import CHECKPOINT_FILE, FORMAT, checkpoint_context, load_checkpoint, server_key_file

    monkeypatch.setenv("PFL_KEY_DIR", str(tmp_path / "keys"))
    key = signing_key(server_key_file())  # signed by the server: what the checks after the signature see
    save_tree(
        tmp_path / CHECKPOINT_FILE,
        {"format": FORMAT, "round": 1, "state": {}, "records": "{not json", "elapsed_s": 0.0, "resumes": []},
        key=key,
        context=checkpoint_context(tmp_path),
    )
    with pytest.raises(StateFileError, match="damaged checkpoint"):
        load_checkpoint(tmp_path)
    save_tree(
        tmp_path / CHECKPOINT_FILE, {"format": FORMAT, "state": {}}, key=key, context=checkpoint_context(tmp_path)
    )
    with pytest.raises(StateFileError, match="damaged checkpoint .*KeyError"):
        load_checkpoint(tmp_path)
