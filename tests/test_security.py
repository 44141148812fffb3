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
    script = (f"import os, runpy, sys; os.umask(0); sys.argv = ['generate_certs.py', '--out', {str(out)!r}, "
              f"'--nodes', 'node-0']; runpy.run_path({str(REPO / 'deploy' / 'generate_certs.py')!r}, "
              "run_name='__main__')")
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
