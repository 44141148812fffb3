"""A real deployment on one machine: a TLS SuperLink with SuperNode authentication, SuperNode processes,
`flwr run` against it; every process started here is stopped by its process group (tests, try-outs)."""

from __future__ import annotations

import ssl
import subprocess
import time
from pathlib import Path

import httpx

from .local_superlink import LocalSuperLink, free_port, stop_process_tree

CONNECTION = "deploy"  # name of the SuperLink connection written to FLWR_HOME/config.toml


class TLSSuperLink(LocalSuperLink):
    """`flower-superlink` with TLS (certificates from deploy/generate_certs.py) and --enable-supernode-auth.

    Its FLWR_HOME holds a config.toml whose default connection is this SuperLink with the CA as root
    certificate, so `flwr run APP deploy`, `flwr supernode register` and `flwr ls` all reach it over TLS.
    """

    def __init__(self, home: Path, certs: Path) -> None:
        super().__init__(home)
        self.certs = Path(certs).resolve()
        self.supernodes: list[tuple[subprocess.Popen, Path]] = []

    @property
    def ca(self) -> Path:
        """The CA certificate clients trust."""
        return self.certs / "ca.crt"

    def start(self, timeout: float = 60.0) -> TLSSuperLink:
        """Start the SuperLink on a free loopback port and wait until it answers over HTTPS."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.http_port}"\nroot-certificates = "{self.ca}"\n')
        log_file = self.home / "superlink.log"
        command = ["flower-superlink", "--ssl-ca-certfile", str(self.ca), "--ssl-certfile",
                   str(self.certs / "server.pem"), "--ssl-keyfile", str(self.certs / "server.key"),
                   "--enable-supernode-auth", "--isolation", "subprocess", "--host", "127.0.0.1",
                   "--port", str(self.http_port), "--disable-runtime-dependency-installation"]
        with open(log_file, "ab") as log:
            self.process = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout
        trust = ssl.create_default_context(cafile=str(self.ca))
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"flower-superlink exited with {self.process.returncode}; see {log_file}")
            try:
                httpx.get(f"https://127.0.0.1:{self.http_port}/health", timeout=0.5, verify=trust)
                return self
            except httpx.HTTPError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"flower-superlink did not answer over HTTPS in {timeout:.0f}s; see {log_file}")

    def register(self, public_key: Path) -> subprocess.CompletedProcess:
        """`flwr supernode register KEY.pub deploy`: allow the SuperNode holding the matching private key."""
        return subprocess.run(["flwr", "supernode", "register", str(public_key), CONNECTION], env=self.env,
                              capture_output=True, text=True, timeout=60)

    def start_supernode(self, private_key: Path, node_config: str) -> tuple[subprocess.Popen, Path]:
        """Start `flower-supernode` over TLS with its authentication key; returns the process and its log."""
        log_file = self.home / f"supernode-{len(self.supernodes)}.log"
        command = ["flower-supernode", "--root-certificates", str(self.ca), "--auth-supernode-private-key",
                   str(private_key), "--superlink", f"127.0.0.1:{self.http_port}", "--node-config", node_config,
                   "--isolation", "subprocess", "--port", str(free_port()), "--max-retries", "2"]
        with open(log_file, "ab") as log:
            process = subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.supernodes.append((process, log_file))
        return process, log_file

    def federation_args(self, num_supernodes: int, cpus_per_client: int) -> list[str]:
        """The deployment connection instead of simulation options."""
        return [CONNECTION]

    def stop(self) -> None:
        """Stop every SuperNode, then the SuperLink (each with its process group)."""
        for process, _ in self.supernodes:
            stop_process_tree(process)
        self.supernodes = []
        super().stop()

