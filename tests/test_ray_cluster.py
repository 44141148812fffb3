"""Scale-out: a simulation on an existing Ray cluster (Flower's Ray backend joins it through RAY_ADDRESS).
On loopback: start a Ray head, point a SuperLink's simulation at it, finish a short run, stop the head."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import REPO
from .harness.local_superlink import LocalSuperLink, free_port, stop_process_tree

pytestmark = pytest.mark.e2e

JOBS = (
    "import json, ray, ray._private.state as s; ray.init(address='{address}', logging_level='ERROR'); "
    "print(json.dumps([j.get('Entrypoint', '') for j in s.jobs()]))"
)


def test_simulation_runs_on_an_existing_ray_cluster(tmp_path) -> None:
    address = f"127.0.0.1:{free_port()}"
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))  # Ray's socket paths must stay short
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    log = tmp_path / "ray-head.log"
    with open(log, "wb") as out:
        head = subprocess.Popen(
            [
                "ray",
                "start",
                "--head",
                "--block",
                "--port",
                address.split(":")[1],
                "--node-ip-address",
                "127.0.0.1",
                "--num-cpus",
                "2",
                "--include-dashboard=false",
                "--disable-usage-stats",
                "--temp-dir",
                str(temp),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    link = LocalSuperLink(tmp_path / "flwr-home")
    link.env["RAY_ADDRESS"] = address  # the simulation's ray.init() joins this cluster instead of starting one
    try:
        deadline = time.monotonic() + 180
        while "Ray runtime started" not in log.read_text():
            assert head.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.5)
        with link:
            outcome = link.run(
                REPO,
                f"num-rounds=2 fraction-train=0.5 local-epochs=1 results-dir='{tmp_path}' run-name='on-ray'",
                num_supernodes=4,
            )
        assert outcome.status == "finished:completed", outcome.output[-3000:]
        rounds = (tmp_path / "on-ray" / "metrics.jsonl").read_text().splitlines()
        assert len(rounds) == 2 and json.loads(rounds[-1])["eval"]["num_clients"] == 4
        jobs = subprocess.run(
            [sys.executable, "-c", JOBS.format(address=address)], env=env, capture_output=True, text=True, timeout=120
        )
        entrypoints = json.loads(jobs.stdout.strip().splitlines()[-1])
        assert any("flwr-simulation" in e for e in entrypoints), f"the run did not use the cluster: {entrypoints}"
    finally:
        link.stop()
        stop_process_tree(head)
        shutil.rmtree(temp, ignore_errors=True)
    time.sleep(1)
    assert head.poll() is not None
    assert not _processes_mentioning(str(temp)), "a process of the Ray head survived"


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="ignore"):
                found.append(cmdline.parent.name)
        except OSError:  # the process ended meanwhile
            continue
    return found
