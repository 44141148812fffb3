"""deploy/one_machine.py as a user runs it: certificates made, SuperLink, nginx from a private prefix and two
authenticated SuperNodes on free loopback ports, the printed `flwr` commands run a DM-PFL run to
"finished:completed", and Ctrl-C stops every process it started (exit 130)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.run.superlink import descendants, stop_process_tree

from .conftest import REPO
from .harness.deployment import nginx_binary
from .harness.processes import still_running

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        nginx_binary() is None and not os.environ.get("CI"),
        reason="nginx is not installed (Debian: apt-get install nginx); .ci/run installs it and CI never skips this",
    ),
]


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
def test_one_machine_deployment_runs_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    out = tmp_path / "stdout"
    with out.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, str(REPO / "deploy" / "one_machine.py"), "--nodes", "2", "--home", str(tmp_path / "d")],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(
                signal.SIGINT, signal.SIG_DFL
            ),  # Ctrl+C's default (see test_cli_terminate)
        )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and "Ctrl-C stops everything." not in out.read_text():
            assert process.poll() is None, out.read_text()
            time.sleep(0.5)
        printed = out.read_text()
        assert "Ctrl-C stops everything." in printed, printed
        ca = tmp_path / "d" / "certs" / "ca.crt"
        assert f'root-certificates = "{ca}"' in printed and ca.is_file(), "the CA's absolute path, ready to paste"
        assert re.search(r'\[superlink\.deploy\]\naddress = "127\.0\.0\.1:\d+"', printed)
        (run_line,) = [line.strip() for line in printed.splitlines() if " flwr run . deploy " in line]
        words = shlex.split(run_line)
        env = {
            **os.environ,
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            words[0].split("=")[0]: words[0].split("=", 1)[1],
        }
        config = words[words.index("--run-config") + 1].replace("num-rounds=3", "num-rounds=1")
        command = [*words[1 : words.index("--run-config")], "--run-config", config]
        started = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        run_id = re.search(r"Successfully started run (\d+)", started.stdout + started.stderr)
        assert run_id, started.stdout[-2000:] + started.stderr[-2000:]
        listed = subprocess.run(
            ["flwr", "ls", "deploy", "--run-id", run_id.group(1), "--format", "json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert json.loads(listed.stdout)["runs"][0]["status"] == "finished:completed", listed.stdout
        summaries = list((tmp_path / "d" / "results").glob("*/summary.json"))
        assert len(summaries) == 1 and json.loads(summaries[0].read_text())["num_clients"] == 2
        running = descendants(process.pid)
        assert len(running) >= 4, "SuperLink, nginx and two SuperNodes"
        os.kill(process.pid, signal.SIGINT)
        assert process.wait(timeout=120) == 130
        assert not still_running(running), "processes of the deployment outlived Ctrl-C"
    finally:
        stop_process_tree(process, graceful=False)


def test_a_home_folder_others_can_read_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Keys and certificates never go into a folder another local user made first or can read (a fixed path under
    /tmp would be one)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("one_machine", REPO / "deploy" / "one_machine.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    assert module.main(["--home", str(shared)]) == 2
    assert "no one else can read (mode 0700)" in capsys.readouterr().out
    assert not (shared / "certs").exists(), "nothing written there"
