"""The quick start runs on a SuperLink of its own: a decoy answering on Flower's default local SuperLink port (as
another checkout's SuperLink would) is never contacted, and the simulation's Ray listens on loopback only."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.run.superlink import LocalSuperLink

pytestmark = pytest.mark.e2e


class _Decoy(http.server.BaseHTTPRequestHandler):
    """Answers every request with 200, as a healthy SuperLink's HTTP endpoint would, and records it."""

    seen: list[str] = []

    def do_GET(self) -> None:
        self.seen.append(f"GET {self.path}")
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def decoy() -> Iterator[list[str]]:
    from flwr.cli.constant import LOCAL_SUPERLINK_HTTP_API_PORT

    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", int(LOCAL_SUPERLINK_HTTP_API_PORT)), _Decoy)
    except OSError as exc:
        pytest.skip(f"port {LOCAL_SUPERLINK_HTTP_API_PORT} is taken here ({exc}): no room for the decoy")
    _Decoy.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield _Decoy.seen
    server.shutdown()
    server.server_close()


def test_the_quick_start_runs_beside_a_decoy_superlink_on_the_default_port(
    decoy: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The README's command, two rounds instead of twenty.
    argv = ["run", "--preset", "quickstart", "--engine", "simulation", "--set", "num-rounds=2", "--out", str(tmp_path)]
    assert main(argv) == 0, capsys.readouterr().out[-3000:]
    out = capsys.readouterr().out
    summary = tmp_path / "fedavg-digits-quickstart" / "fedavg-digits-quickstart-seed0" / "summary.md"
    assert summary.is_file() and f"summary: {summary}" in out
    assert f"next: pflower report {summary.parent.parent}" in out  # the experiment's own folder
    assert "(10 simulated SuperNodes)" in out
    assert decoy == [], "the quick start talked to the SuperLink on the default port"
    assert "Flower configuration not found" not in out and "\x1b[" not in out  # not a terminal: plain lines


def test_a_local_simulation_ray_listens_on_loopback_only(tmp_path: Path) -> None:
    link = LocalSuperLink(tmp_path)  # its environment is what `flwr run` and the simulation get
    probe = (
        "import ray; ray.init(num_cpus=1, include_dashboard=False, logging_level='ERROR'); "
        "print(ray.util.get_node_ip_address(), ray.get_runtime_context().gcs_address); ray.shutdown()"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=link.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    node_ip, gcs = done.stdout.split()[-2:]
    assert node_ip == "127.0.0.1" and gcs.startswith("127.0.0.1:")
