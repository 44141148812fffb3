"""Scale-out: a simulation on an existing Ray cluster (Flower's Ray backend joins it through RAY_ADDRESS).
On loopback: start a Ray head, point a SuperLink's simulation at it, finish a short run, stop the head."""

from __future__ import annotations

import json
import subprocess
import sys

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
