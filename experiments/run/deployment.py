"""A real deployment on one machine: a TLS SuperLink with SuperNode authentication on loopback behind the
project's nginx reverse proxy (deploy/nginx/pflower-fleet.conf), SuperNode processes that reach it through the
proxy, `flwr run` against it; every process started here is stopped by its process group (tests, try-outs)."""

from __future__ import annotations

import getpass
import os
import shutil
import ssl
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from .superlink import LocalSuperLink, free_port, stop_process_tree
from .tether import tethered_popen

WARM_PAIR = Path(__file__).resolve().parents[2] / "deploy" / "warm-supernode.sh"  # a SuperNode + its warm ClientApp
CONNECTION = "deploy"  # the operator's connection in FLWR_HOME/config.toml: the SuperLink itself, on loopback
OUTSIDE = "outside"  # the same CLI pointed at the proxy, as anyone holding only ca.crt could
PROXY_CONF = Path(__file__).resolve().parents[2] / "deploy" / "nginx" / "pflower-fleet.conf"  # in the repository
SHIPPED_LISTEN, SHIPPED_UPSTREAM, SHIPPED_CERTS = "listen 9093 ", "127.0.0.1:9092", "/etc/pflower/certs/"
PER_ADDRESS_LIMITS = (("limit_conn pflower_fleet_conn ", 16), ("rate=", 50), ("burst=", 500))  # shipped, one address


def nginx_binary() -> str | None:
    """nginx on PATH or in /usr/sbin (where Debian puts it), else None."""
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)


class FleetProxy:
    """nginx running the shipped pflower-fleet.conf, its port and paths rewritten for this machine; its per-address
    limits times `nodes_per_address` (every SuperNode here comes from 127.0.0.1: the NAT case the shipped file's
    comment tells operators to raise them for)."""

    def __init__(self, home: Path, certs: Path, upstream_port: int, nodes_per_address: int = 1) -> None:
        self.home, self.certs, self.upstream_port = Path(home), Path(certs), upstream_port
        self.nodes_per_address = nodes_per_address
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    def config(self) -> str:
        """The shipped server block with this run's port, SuperLink port and certificate folder."""
        shipped = PROXY_CONF.read_text()
        for token in (SHIPPED_LISTEN, SHIPPED_UPSTREAM, SHIPPED_CERTS):
            assert token in shipped, f"{PROXY_CONF} no longer holds {token!r}: update the test harness"
        server = (
            shipped.replace(SHIPPED_LISTEN, f"listen 127.0.0.1:{self.port} ")
            .replace(SHIPPED_UPSTREAM, f"127.0.0.1:{self.upstream_port}")
            .replace(SHIPPED_CERTS, f"{self.certs}/")
        )
        for token, shipped_value in PER_ADDRESS_LIMITS:
            assert f"{token}{shipped_value}" in server, f"{PROXY_CONF} no longer holds {token}{shipped_value}"
            server = server.replace(f"{token}{shipped_value}", f"{token}{shipped_value * self.nodes_per_address}")
        temp = self.home / "nginx-temp"
        return (
            f"user {getpass.getuser()};\nworker_processes 1;\npid {self.home / 'nginx.pid'};\n"
            f"events {{ worker_connections {max(256, 16 * self.nodes_per_address)}; }}\n"
            f"http {{\n    access_log {self.home / 'nginx-access.log'};\n"
            + "".join(
                f"    {kind}_temp_path {temp / kind};\n"
                for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
            )
            + server
            + "}\n"
        )

    def start(self, timeout: float = 30.0) -> FleetProxy:
        """Start nginx in the foreground of its own process group; wait until it accepts TLS connections."""
        binary = nginx_binary()
        if binary is None:
            raise RuntimeError("nginx is not installed (Debian: apt-get install nginx)")
        (self.home / "nginx-temp").mkdir(parents=True, exist_ok=True)
        conf = self.home / "nginx.conf"
        conf.write_text(self.config())
        log_file = self.home / "nginx-error.log"
        self.process = tethered_popen(
            [binary, "-p", str(self.home), "-e", str(log_file), "-c", str(conf), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        trust = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited with {self.process.returncode}; see {log_file}")
            try:
                httpx.get(f"https://127.0.0.1:{self.port}/", timeout=0.5, verify=trust)
                return self
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"nginx did not answer in {timeout:.0f}s; see {log_file}")

    def stop(self) -> None:
        """Stop nginx and its workers."""
        if self.process is not None:
            stop_process_tree(self.process)
            self.process = None


class TLSSuperLink(LocalSuperLink):
    """`flower-superlink` with TLS (certificates from deploy/generate_certs.py) and --enable-supernode-auth.

    It listens on loopback only; SuperNodes reach it through the FleetProxy. Its FLWR_HOME holds a config.toml
    whose default connection (`deploy`) is the SuperLink itself with the CA as root certificate, so the
    operator's `flwr run APP deploy`, `flwr supernode register` and `flwr ls` reach it over TLS; `outside` points
    the same CLI at the proxy.
    """

    def __init__(self, home: Path, certs: Path, database: Path | None = None, nodes_per_address: int = 1) -> None:
        super().__init__(home)
        self.certs = Path(certs).resolve()
        self.database = database  # the SuperLink's state on disk (runs, registered keys): survives its restart
        self.supernodes: list[tuple[subprocess.Popen, Path]] = []
        self.proxy = FleetProxy(self.home, self.certs, self.http_port, nodes_per_address)

    @property
    def ca(self) -> Path:
        """The CA certificate clients trust."""
        return self.certs / "ca.crt"

    def start(self, timeout: float = 60.0) -> TLSSuperLink:
        """Start the SuperLink on a free loopback port and wait until it answers over HTTPS, then the proxy."""
        self.start_link(timeout)
        self.proxy.start()
        return self

    def start_link(self, timeout: float = 60.0) -> None:
        """Start (or start again, on the same ports) the SuperLink process alone; wait until it answers."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.http_port}"\nroot-certificates = "{self.ca}"\n\n[superlink.{OUTSIDE}]\n'
            f'address = "127.0.0.1:{self.proxy.port}"\nroot-certificates = "{self.ca}"\n'
        )
        log_file = self.home / "superlink.log"
        command = [
            "pflower-superlink",  # flower-superlink with the per-message store bound (server_app/linkguard.py)
            "--ssl-ca-certfile",
            str(self.ca),
            "--ssl-certfile",
            str(self.certs / "server.pem"),
            "--ssl-keyfile",
            str(self.certs / "server.key"),
            "--enable-supernode-auth",
            "--isolation",
            "subprocess",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.http_port),
            "--disable-runtime-dependency-installation",
            *(["--database", str(self.database)] if self.database is not None else []),
        ]
        with open(log_file, "ab") as log:
            self.process = tethered_popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        trust = ssl.create_default_context(cafile=str(self.ca))
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"flower-superlink exited with {self.process.returncode}; see {log_file}")
            try:
                httpx.get(f"https://127.0.0.1:{self.http_port}/health", timeout=0.5, verify=trust)
                return
            except httpx.HTTPError:
                time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"flower-superlink did not answer over HTTPS in {timeout:.0f}s; see {log_file}")

    def register(self, public_key: Path, connection: str = CONNECTION) -> subprocess.CompletedProcess:
        """`flwr supernode register KEY.pub deploy`: allow the SuperNode holding the matching private key."""
        return self.flwr("supernode", "register", str(public_key), connection)

    def flwr(self, *args: str) -> subprocess.CompletedProcess:
        """The `flwr` CLI with this deployment's FLWR_HOME."""
        return subprocess.run(["flwr", *args], env=self.env, capture_output=True, text=True, timeout=120)

    def start_supernode(
        self,
        private_key: Path,
        node_config: str,
        *extra: str,
        max_retries: int | None = 2,
        runtime_port: int | None = None,
        warm: bool = False,
        launcher: Sequence[str] = (),
    ) -> tuple[subprocess.Popen, Path]:
        """Start `flower-supernode` over TLS with its authentication key (giving up after `max_retries` failed
        connections; None: never); returns the process and its log. `warm`: the SuperNode with its long-lived
        ClientApp as one pair (deploy/warm-supernode.sh: isolation `process`, `pflower-clientapp` on `runtime_port`;
        the returned process is the pair's script); `launcher`: a command prefix (e.g. one that enters a cgroup and
        execs the rest)."""
        log_file = self.home / f"supernode-{len(self.supernodes)}.log"
        port = str(runtime_port or free_port())
        options = [
            "--root-certificates",
            str(self.ca),
            "--auth-supernode-private-key",
            str(private_key),
            "--superlink",
            f"127.0.0.1:{self.proxy.port}",
            "--node-config",
            node_config,
            *(["--max-retries", str(max_retries)] if max_retries is not None else []),
            *extra,
        ]
        if warm:
            command = [*launcher, str(WARM_PAIR), "--runtime-port", port, "--", *options]
        else:
            command = [*launcher, "flower-supernode", *options, "--isolation", "subprocess", "--port", port]
        with open(log_file, "ab") as log:
            process = tethered_popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.supernodes.append((process, log_file))
        return process, log_file

    def federation_args(
        self, num_supernodes: int, cpus_per_client: int, ray_cpus: int = 0, gpus_per_client: float = 0.0
    ) -> list[str]:
        """The deployment connection instead of simulation options."""
        return [CONNECTION]

    def stop(self) -> None:
        """Stop every SuperNode, then the SuperLink (each with its process group)."""
        for process, _ in self.supernodes:
            stop_process_tree(process)
        self.supernodes = []
        self.proxy.stop()
        super().stop()
