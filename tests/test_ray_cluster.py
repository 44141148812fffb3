"""Scale-out: a simulation on an existing Ray cluster (Flower's Ray backend joins it through RAY_ADDRESS).
On loopback: start a Ray head, point a SuperLink's simulation at it, finish a short run, stop the head."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from .conftest import REPO
from .harness.ray_head import RayHead

pytestmark = pytest.mark.e2e

JOBS = (
    "import json, ray, ray._private.state as s; ray.init(address='{address}', logging_level='ERROR'); "
    "print(json.dumps([j.get('Entrypoint', '') for j in s.jobs()]))"
)


def test_simulation_runs_on_an_existing_ray_cluster(tmp_path) -> None:
    with RayHead(tmp_path / "ray-head.log") as head:
        # the simulation's ray.init() joins this cluster instead of starting one
        with head.superlink(tmp_path / "flwr-home") as link:
            outcome = link.run(
                REPO,
                f"num-rounds=2 fraction-train=0.5 local-epochs=1 results-dir='{tmp_path}' run-name='on-ray'",
                num_supernodes=4,
            )
        assert outcome.status == "finished:completed", outcome.output[-3000:]
        rounds = (tmp_path / "on-ray" / "metrics.jsonl").read_text().splitlines()
        assert len(rounds) == 2 and json.loads(rounds[-1])["eval"]["num_clients"] == 4
        jobs = subprocess.run(
            [sys.executable, "-c", JOBS.format(address=head.address)],
            env=head.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        entrypoints = json.loads(jobs.stdout.strip().splitlines()[-1])
        assert any("flwr-simulation" in e for e in entrypoints), f"the run did not use the cluster: {entrypoints}"


JOIN = "import ray; ray.init(address='{address}', logging_level='ERROR'); print('joined', flush=True); input()"


def test_two_ray_heads_on_one_machine_give_their_drivers_different_ports(tmp_path) -> None:
    # Two test files on two xdist workers each start a head at once: with `ray start`'s own worker ports both
    # heads handed their first driver port 10002, and one driver aborted (its run failed without output).
    heads = [RayHead(tmp_path / f"head-{n}.log") for n in range(2)]
    starts = [threading.Thread(target=head.start) for head in heads]
    for start in starts:
        start.start()
    for start in starts:
        start.join()
    try:
        assert all(head.process is not None for head in heads), "a Ray head did not start"
        drivers = [
            subprocess.Popen(
                [sys.executable, "-c", JOIN.format(address=head.address)],
                env=head.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for head in heads
        ]
        joined = [driver.stdout.readline().strip() if driver.stdout else "" for driver in drivers]
        for driver in drivers:
            driver.communicate("\n", timeout=60)
        exits = [driver.returncode for driver in drivers]
        assert joined == ["joined", "joined"] and exits == [0, 0], (joined, exits)
    finally:
        for head in heads:
            head.stop()
