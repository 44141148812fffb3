"""A real deployment on loopback: TLS SuperLink with SuperNode authentication, two SuperNodes with their own
partitions, DM-PFL through `flwr run`, an unregistered SuperNode refused; every process stopped."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from server_app.deployment import TLSSuperLink

from .conftest import REPO

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    out = tmp_path_factory.mktemp("certs")
    done = subprocess.run([sys.executable, str(REPO / "deploy" / "generate_certs.py"), "--out", str(out),
                           "--nodes", "node-0,node-1,intruder"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out


def test_tls_deployment_with_authenticated_supernodes(certs, tmp_path) -> None:
    link = TLSSuperLink(tmp_path / "flwr-home", certs).start()
    try:
        for name in ("node-0", "node-1"):
            registered = link.register(certs / "nodes" / f"{name}.pub")
            assert registered.returncode == 0 and "registered successfully" in registered.stdout, registered.stdout
        nodes = [link.start_supernode(certs / "nodes" / f"node-{i}", f"partition-id={i} num-partitions=2")
                 for i in range(2)]
        intruder, intruder_log = link.start_supernode(certs / "nodes" / "intruder", "partition-id=0 num-partitions=2")
        assert intruder.wait(timeout=120) != 0, "a SuperNode whose key is not registered must be refused"
        assert "Failed to activate SuperNode" in intruder_log.read_text()
        assert all(process.poll() is None for process, _ in nodes)

        results = tmp_path / "results"
        outcome = link.run(REPO, f"algorithm='dmpfl' iterations=1 num-rounds=3 fraction-train=1.0 local-epochs=1 "
                                 f"results-dir='{results}' run-name='deployed'", timeout=600)
        assert outcome.status == "finished:completed", outcome.output[-3000:]
        rounds = [json.loads(line) for line in (results / "deployed" / "metrics.jsonl").read_text().splitlines()]
        assert [r["phase"] for r in rounds] == [1, 2, 3]
        assert all(r["train"]["used"] == 2 for r in rounds)
        assert rounds[-1]["eval"]["num_clients"] == 2 and rounds[-1]["eval"]["mean"]["acc-shift-0"] > 0.5
        assert "Uvicorn running on https://127.0.0.1" in (link.home / "superlink.log").read_text(), "TLS"
        for _, log in nodes:
            assert "SuperNode ID:" in log.read_text(), "authenticated SuperNode"
        print(f"TLS SuperLink log: {link.home / 'superlink.log'}; SuperNode logs: {[str(log) for _, log in nodes]}")
    finally:
        link.stop()
    time.sleep(1)
    assert all(process.poll() is not None for process, _ in link.supernodes + nodes)
