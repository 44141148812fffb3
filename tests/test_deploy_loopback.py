"""A real deployment on loopback: TLS SuperLink with SuperNode authentication on 127.0.0.1 behind the shipped
nginx proxy, which passes on the Fleet API only; an outsider holding ca.crt cannot list runs, register a key or
start a run through it; two SuperNodes with their own partitions and state dirs run DM-PFL through the proxy, an
unregistered SuperNode is refused, a SuperNode that verifies apps refuses the unsigned app, one SuperNode is
killed with SIGKILL mid-run and restarted (it goes on from its state dir); every process stopped."""

from __future__ import annotations

import http.client
import json
import os
import re
import ssl
import subprocess
import sys
import time

import pytest

from .conftest import REPO
from .harness.deployment import OUTSIDE, TLSSuperLink, nginx_binary, restart_until_admitted
from .harness.local_superlink import stop_process_tree

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        nginx_binary() is None and not os.environ.get("CI"),
        reason="nginx is not installed (Debian: apt-get install nginx); .ci/run installs it and CI never skips this",
    ),
]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    out = tmp_path_factory.mktemp("certs")
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "deploy" / "generate_certs.py"),
            "--out",
            str(out),
            "--nodes",
            "node-0,node-1,intruder,verifier",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return out


def outsider_is_shut_out(link: TLSSuperLink, certs) -> None:
    """Holding only ca.crt, through the proxy: no run listed, no key registered, no run started, no detour."""
    for args in (
        ("ls", OUTSIDE),
        ("supernode", "register", str(certs / "nodes" / "intruder.pub"), OUTSIDE),
        ("run", str(REPO), OUTSIDE, "--run-config", "num-rounds=1"),
    ):
        done = link.flwr(*args)
        assert done.returncode != 0 and "404 Not Found" in done.stdout + done.stderr, (args, done.stdout[-2000:])
    trust = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    for method, path in (
        ("POST", "/v1/control/list-runs"),
        ("POST", "/v1/fleet/../control/list-runs"),
        ("POST", "/v1/fleet/%2e%2e/control/start-run"),
        ("GET", "/health"),
        ("POST", "/v1/fleet/pull-messages"),
    ):
        connection = http.client.HTTPSConnection("127.0.0.1", link.proxy.port, context=trust, timeout=30)
        connection.request(method, path, body=b"", headers={"Content-Type": "application/protobuf"})
        status = connection.getresponse().status
        connection.close()
        assert status == (401 if path == "/v1/fleet/pull-messages" else 404), (method, path, status)
    # (the intruder's key was not registered: its SuperNode is refused later in the test)


def trusted_entities_file(tmp_path):
    """A --trusted-entities file naming an ed25519 key of our own (the operator's signing key)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    public = (
        ed25519.Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    path = tmp_path / "trusted.yaml"
    path.write_text(f"fpk_operator: '{public}'\n")
    return path


def test_tls_deployment_with_authenticated_supernodes(certs, tmp_path) -> None:
    link = TLSSuperLink(tmp_path / "flwr-home", certs).start()
    try:
        outsider_is_shut_out(link, certs)
        for name in ("node-0", "node-1", "verifier"):
            registered = link.register(certs / "nodes" / f"{name}.pub")
            assert registered.returncode == 0 and "registered successfully" in registered.stdout, registered.stdout
        node_config = [f"partition-id={i} num-partitions=2 state-dir='{tmp_path / f'state-{i}'}'" for i in range(2)]
        nodes = [link.start_supernode(certs / "nodes" / f"node-{i}", node_config[i]) for i in range(2)]
        intruder, intruder_log = link.start_supernode(certs / "nodes" / "intruder", "partition-id=0 num-partitions=2")
        assert intruder.wait(timeout=120) != 0, "a SuperNode whose key is not registered must be refused"
        assert "Failed to activate SuperNode" in intruder_log.read_text()
        assert all(process.poll() is None for process, _ in nodes)
        verifier, verifier_log = link.start_supernode(
            certs / "nodes" / "verifier",
            "partition-id=1 num-partitions=2",
            "--trusted-entities",
            str(trusted_entities_file(tmp_path)),
        )

        results = tmp_path / "results"
        # round-timeout: each message starts a ClientApp process (8 s of imports on an idle core, over 30 s beside a
        # busy test worker, when every reply came late); a killed node's message ends sooner, with the SuperLink's
        # node-unavailable reply once its heartbeats lapse
        runner = link.start_run(
            REPO,
            f"algorithm='dmpfl' max-weight-ratio=4 max-update-ratio=3 iterations=1 num-rounds=6 fraction-train=1.0 "
            f"local-epochs=1 round-timeout=90 results-dir='{results}' run-name='deployed'",
        )
        # app verification: the open-source SuperLink attaches no verification to a submitted app, so a SuperNode
        # started with --trusted-entities refuses every app, the operator's own included (deploy/README.md)
        deadline = time.monotonic() + 120
        while "App verification is not supported" not in verifier_log.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "App verification is not supported by the connected SuperLink" in verifier_log.read_text()
        stop_process_tree(verifier)
        # kill -9 SuperNode 1 (and its ClientApp process) once it has saved its state of round 2, then restart it
        states = tmp_path / "state-1"  # <state-dir>/deployed.<the start of the run id>/partition-1
        deadline = time.monotonic() + 300
        while (
            not list(states.glob("deployed.*/partition-1/round-00000[2-9].npz"))
            and time.monotonic() < deadline
            and runner.poll() is None
        ):
            time.sleep(0.05)
        saved_states = list(states.glob("deployed.*/partition-1"))
        if not saved_states:  # say why: the run ended (its log) or it was too slow (the SuperNode's log)
            run_log = "\n".join(path.read_text() for path in link.home.glob("run-*.log"))
            ended = f"the run ended (exit {runner.poll()})" if runner.poll() is not None else "300 s passed"
            pytest.fail(
                f"SuperNode 1 wrote no state of round 2 before {ended}:\n{run_log[-2000:]}\n"
                + nodes[1][1].read_text()[-2000:]
            )
        (saved,) = saved_states
        assert re.fullmatch(r"deployed\.[0-9a-f]{12}", saved.parent.name), "one folder per run, named by its id"
        assert list(saved.glob("round-*.npz")), "SuperNode 1 never wrote its state"
        killed_in_round = len((results / "deployed" / "metrics.jsonl").read_text().splitlines()) + 1
        stop_process_tree(nodes[1][0], graceful=False)
        restarted = restart_until_admitted(link, certs / "nodes" / "node-1", node_config[1])
        runner.wait(timeout=900)
        outcome_log = "\n".join(path.read_text() for path in link.home.glob("run-*.log"))
        run_id = re.search(r"Successfully started run (\d+)", outcome_log).group(1)
        assert link.status(run_id) == "finished:completed", outcome_log[-3000:]

        rounds = [json.loads(line) for line in (results / "deployed" / "metrics.jsonl").read_text().splitlines()]
        assert [r["phase"] for r in rounds] == [1, 1, 1, 2, 2, 3], "the two-phased pipeline, then Algorithm 3"
        after = rounds[killed_in_round:]
        assert any(r["train"]["used"] == 2 for r in after), "the restarted SuperNode trains again"
        assert any(r["eval"]["num_clients"] == 2 for r in after) and rounds[-1]["eval"]["mean"]["acc-shift-0"] > 0.5
        restored = re.findall(r"client state restored from \S+partition-1 \(round (\d+)\)", restarted[1].read_text())
        assert restored and int(restored[0]) >= 2, "the restarted SuperNode went on from the state it saved"
        assert "Uvicorn running on https://127.0.0.1" in (link.home / "superlink.log").read_text(), "TLS"
        for _, log in nodes:
            assert "SuperNode ID:" in log.read_text(), "authenticated SuperNode"
        nodes.append(restarted)
        print(f"TLS SuperLink log: {link.home / 'superlink.log'}; SuperNode logs: {[str(log) for _, log in nodes]}")
    finally:
        link.stop()
    time.sleep(1)
    assert all(process.poll() is not None for process, _ in link.supernodes + nodes)
