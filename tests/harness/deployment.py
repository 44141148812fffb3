"""The loopback TLS deployment (experiments/run/deployment.py), re-exported for the tests, and a SuperNode restarted
as systemd's Restart=always would."""

import subprocess
import time
from pathlib import Path
from typing import Any

from experiments.run.deployment import CONNECTION, OUTSIDE, FleetProxy, TLSSuperLink, nginx_binary

__all__ = ["CONNECTION", "OUTSIDE", "FleetProxy", "TLSSuperLink", "nginx_binary", "restart_until_admitted"]


def restart_until_admitted(
    link: TLSSuperLink, key: Path, node_config: str, patience: float = 300.0, **options: Any
) -> tuple[subprocess.Popen, Path]:
    """Start a SuperNode again (`options` as start_supernode's), as systemd's Restart= would, until the SuperLink
    admits it: the SuperLink refuses the key while the killed process still counts as online (2 missed 30 s
    heartbeats)."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        process, log = link.start_supernode(key, node_config, **options)
        while process.poll() is None and time.monotonic() < deadline:
            if "SuperNode ID:" in log.read_text():
                return process, log
            time.sleep(0.5)
        time.sleep(5)
    raise AssertionError(f"the restarted SuperNode was never admitted; see {link.home}")
