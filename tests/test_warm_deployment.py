"""The long-lived ClientApp in a real deployment: two SuperNodes on the loopback TLS SuperLink behind the shipped
nginx proxy, each run with its `pflower-clientapp` as one pair by deploy/warm-supernode.sh (TLSSuperLink's warm
SuperNode, the device recipe's default). Node 0's ClientApp is killed with SIGKILL once it has saved its state of
round 2 (while it pushes that reply, the worst moment: its SuperNode would wait for the reply's objects for ever);
the pair script stops that SuperNode too and exits, and is started again as systemd would; the run finishes, the
restarted ClientApp goes on from the saved state, and every message a ClientApp served ran in that one process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO
from .harness.deployment import TLSSuperLink, nginx_binary, restart_until_admitted
from .harness.local_superlink import descendants, free_port

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed (Debian: apt-get install nginx)"),
]


def _profile_lines(folder: Path) -> list[dict]:
    lines = [line for path in sorted(folder.glob("client-*.jsonl")) for line in path.read_text().splitlines()]
    return [json.loads(line) for line in lines if line]


def _clientapp_of(pair: subprocess.Popen) -> int:
    for pid in descendants(pair.pid):
        try:
            if b"pflower-clientapp" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    raise AssertionError("the pair has no pflower-clientapp")


def test_a_killed_warm_clientapp_restarts_with_its_supernode_and_the_run_finishes(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    done = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "generate_certs.py"), "--out", str(certs), "--nodes", "node-0,node-1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    link = TLSSuperLink(tmp_path / "flwr-home", certs).start()
    profile = tmp_path / "profile-0"
    profile.mkdir()
    try:
        for name in ("node-0", "node-1"):
            assert link.register(certs / "nodes" / f"{name}.pub").returncode == 0
        configs = [f"partition-id={i} num-partitions=2 state-dir='{tmp_path / f'state-{i}'}'" for i in range(2)]
        keys, ports = [certs / "nodes" / "node-0", certs / "nodes" / "node-1"], [free_port(), free_port()]
        link.env["PFLOWER_PROFILE"] = str(profile)  # node 0's ClientApp writes a line per message
        first, first_log = link.start_supernode(keys[0], configs[0], runtime_port=ports[0], warm=True)
        del link.env["PFLOWER_PROFILE"]
        link.start_supernode(keys[1], configs[1], runtime_port=ports[1], warm=True)
        results = tmp_path / "results"
        # round-timeout: the reply lost with the killed ClientApp is given up after it
        runner = link.start_run(
            REPO,
            f"algorithm='fedper' dataset='digits' num-rounds=6 fraction-train=1.0 local-epochs=1 "
            f"round-timeout=60 allow-unprotected=true results-dir='{results}' run-name='warm'",
        )
        states = tmp_path / "state-0"
        deadline = time.monotonic() + 400
        while (
            not list(states.glob("warm.*/partition-0/round-00000[2-9].npz"))
            and time.monotonic() < deadline
            and runner.poll() is None
        ):
            time.sleep(0.05)
        assert list(states.glob("warm.*/partition-0/round-*.npz")), f"node 0 saved no state; see {link.home}"
        clientapp = _clientapp_of(first)
        before = _profile_lines(profile)
        os.kill(clientapp, signal.SIGKILL)
        assert first.wait(timeout=60) != 0, "the pair ends with its ClientApp"
        assert "the ClientApp exited" in first_log.read_text()
        # as systemd's Restart=always: start the pair again until the SuperLink admits the node (it refuses the key
        # while the killed session still counts as online, 2 missed 30 s heartbeats)
        link.env["PFLOWER_PROFILE"] = str(profile)
        _, again_log = restart_until_admitted(link, keys[0], configs[0], runtime_port=ports[0], warm=True)
        del link.env["PFLOWER_PROFILE"]
        code = runner.wait(timeout=600)
        run_log = "\n".join(path.read_text() for path in link.home.glob("run-*.log"))
        assert code == 0, run_log[-3000:]
        rounds = [json.loads(line) for line in (results / "warm" / "metrics.jsonl").read_text().splitlines()]
        assert len(rounds) == 6 and rounds[-1]["train"]["used"] == 2, "the restarted pair trains again"
        assert len({line["os_pid"] for line in before}) == 1 and len(before) >= 2, "one process served node 0"
        after = [line for line in _profile_lines(profile) if line["os_pid"] != before[0]["os_pid"]]
        assert after and len({line["os_pid"] for line in after}) == 1, "one new process after the restart"
        restored = re.findall(r"client state restored from \S+partition-0 \(round (\d+)\)", again_log.read_text())
        assert restored and int(restored[-1]) >= 2, "the restarted ClientApp went on from the saved state"
    finally:
        link.stop()
