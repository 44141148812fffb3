"""A deployment on one machine, without root or a system service: certificates and SuperNode keys, a TLS SuperLink
with SuperNode authentication on loopback, the shipped nginx proxy (deploy/nginx/pflower-fleet.conf) run from a
private prefix, and N authenticated SuperNodes reaching it through the proxy, every port a free one; prints the
`flwr` connection (with the CA's absolute path) and the commands of a run; Ctrl-C (or SIGTERM) stops everything.

    python deploy/one_machine.py --nodes 2 --home ~/pflower-deploy

Needs nginx on PATH or in /usr/sbin (Debian: apt-get install nginx; it is not started as a service) and the
project installed (pip install -e .). Everything it writes is under --home: certs/, the SuperLink's FLWR_HOME
(flwr-home/: its config.toml, logs and the nginx files), the SuperNodes' state dirs, results/.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.run.deployment import CONNECTION, TLSSuperLink, nginx_binary

HERE = Path(__file__).resolve().parent


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def node_names(nodes: int) -> list[str]:
    """The SuperNodes' key names: node-0, node-1, ..."""
    return [f"node-{i}" for i in range(nodes)]


def ensure_certs(certs: Path, nodes: int) -> None:
    """Generate the CA, the SuperLink's certificate and the nodes' keys into `certs` where missing."""
    missing = [n for n in node_names(nodes) if not (certs / "nodes" / n).is_file()]
    if (certs / "ca.crt").is_file() and not missing:
        return
    command = [sys.executable, str(HERE / "generate_certs.py"), "--out", str(certs), "--nodes", ",".join(missing)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"one_machine: generate_certs.py failed: {(done.stderr or done.stdout).strip()[-500:]}")


def connection_block(link: TLSSuperLink) -> str:
    """The `flwr` connection to this SuperLink, for ~/.flwr/config.toml (FLWR_HOME below has it already)."""
    return f'[superlink.{CONNECTION}]\naddress = "127.0.0.1:{link.http_port}"\nroot-certificates = "{link.ca}"\n'


def main(argv: list[str] | None = None) -> int:
    """Start the deployment, print how to use it, wait for Ctrl-C, stop everything; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=2, help="SuperNodes, one partition each (default 2)")
    parser.add_argument("--home", type=Path, help="where everything goes (default: a new private temporary folder)")
    parser.add_argument("--certs", type=Path, help="certificates and node keys (default HOME/certs; made if missing)")
    args = parser.parse_args(argv)
    if not 1 <= args.nodes <= 64:
        parser.error("--nodes must be 1 to 64")
    if nginx_binary() is None:
        print("one_machine: nginx is not installed (Debian: apt-get install nginx; no service is started)")
        return 2
    home = (args.home or Path(tempfile.mkdtemp(prefix="pflower-deploy-"))).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = home.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o077:  # keys, certificates and state: this user's alone
        print(f"one_machine: {home} must be a folder of yours that no one else can read (mode 0700); pick another")
        return 2
    certs = (args.certs or home / "certs").expanduser().resolve()
    ensure_certs(certs, args.nodes)
    signal.signal(signal.SIGTERM, _terminated)
    link = TLSSuperLink(home / "flwr-home", certs, database=home / "superlink.db", nodes_per_address=args.nodes)
    try:
        link.start()
        for name in node_names(args.nodes):
            done = link.register(certs / "nodes" / f"{name}.pub")
            if done.returncode != 0 and "already" not in done.stdout + done.stderr:
                print(f"one_machine: registering {name} failed: {(done.stdout + done.stderr).strip()[-300:]}")
                return 1
        for i, name in enumerate(node_names(args.nodes)):
            node_config = f"partition-id={i} num-partitions={args.nodes} state-dir='{home / f'state-{i}'}'"
            link.start_supernode(certs / "nodes" / name, node_config, max_retries=None)
        flwr = f"FLWR_HOME={link.home} flwr"
        run_config = (
            f"algorithm='dmpfl' max-weight-ratio=4 iterations=1 num-rounds=3 fraction-train=1.0 "
            f"results-dir='{home / 'results'}'"
        )
        print(
            f"deployment: SuperLink 127.0.0.1:{link.http_port} (TLS, SuperNode authentication), nginx proxy "
            f"127.0.0.1:{link.proxy.port} (the Fleet API only), {args.nodes} SuperNode(s); logs in {link.home}\n\n"
            f"The `flwr` connection (FLWR_HOME={link.home} holds it; or add it to ~/.flwr/config.toml):\n\n"
            f"{connection_block(link)}\n"
            f"A run, from the project folder ({HERE.parent}):\n\n"
            f'  {flwr} run . {CONNECTION} --stream --run-config "{run_config}"\n'
            f'  {flwr} ls {CONNECTION} --run-id RUN_ID --format json   # "finished:completed" decides\n\n'
            "Ctrl-C stops everything.",
            flush=True,
        )
        while True:
            for index, (process, log) in enumerate(link.supernodes):
                if process.poll() is not None:
                    print(f"one_machine: SuperNode {index} exited with {process.returncode}; see {log}", flush=True)
                    return 1
            if link.process is not None and link.process.poll() is not None:
                print(f"one_machine: the SuperLink exited; see {link.home / 'superlink.log'}", flush=True)
                return 1
            time.sleep(1)
    except KeyboardInterrupt:
        print("one_machine: stopping the SuperNodes, the proxy and the SuperLink", flush=True)
        return 130
    except RuntimeError as exc:  # a process that did not start: one line naming its log
        print(f"one_machine: {exc}", flush=True)
        return 1
    finally:
        link.stop()


if __name__ == "__main__":
    sys.exit(main())
