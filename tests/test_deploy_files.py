"""The deployment recipes, checked where Docker and systemd cannot run: the compose file against the certificate
script and Flower's own flags, the systemd units against the set-up script, the set-up script's dry run."""

from __future__ import annotations

import configparser
import re
import shlex
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from .conftest import REPO

DEPLOY = REPO / "deploy"
COMPOSE = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


@cache
def _flags(program: str) -> set[str]:
    done = subprocess.run([program, "--help"], capture_output=True, text=True, timeout=120)
    return set(re.findall(r"(--[a-z][a-z0-9-]+)", done.stdout))


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    compose = (DEPLOY / "docker-compose.yml").read_text()
    found = re.search(r"python deploy/generate_certs\.py (.+?)\n#\s*then", compose, re.S)
    command = found.group(1).replace("\\\n#", " ")
    args = shlex.split(command.replace("--out deploy/certs", f"--out {out}"))
    done = subprocess.run(
        [sys.executable, str(DEPLOY / "generate_certs.py"), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return out


def _command(service: str) -> list[str]:
    return shlex.split(SERVICES[service]["command"])


def _mounts(service: str) -> dict[str, str]:
    """container path -> host path of a service's volumes."""
    out = {}
    for volume in SERVICES[service].get("volumes", []):
        host, container = volume.split(":")[:2]
        out[container] = host
    return out


def test_compose_has_a_superlink_and_supernodes_with_their_own_partitions() -> None:
    assert {"superlink", "proxy", "supernode-0", "supernode-1", "flwr"} <= set(SERVICES)
    assert "9093:9093" in SERVICES["superlink"]["ports"]
    partitions = set()
    for name in ("supernode-0", "supernode-1"):
        command = _command(name)
        assert command[0] == "flower-supernode" and command[command.index("--superlink") + 1] == "superlink:9093"
        node_config = command[command.index("--node-config") + 1]
        fields = dict(item.split("=", 1) for item in node_config.split())
        partitions.add(int(fields["partition-id"]))
        assert fields["num-partitions"] == "2" and fields["state-dir"] == "'/state'"
        state_volume = _mounts(name)["/state"]
        assert state_volume in COMPOSE["volumes"], "each SuperNode's state lives in its own named volume"
    assert partitions == {0, 1}


@pytest.mark.parametrize("service", ["superlink", "supernode-0", "supernode-1"])
def test_compose_flags_exist_and_every_file_they_name_is_mounted(service: str, certs: Path) -> None:
    command = _command(service)
    known = _flags(command[0])
    for flag in [word for word in command if word.startswith("--")]:
        assert flag in known, f"{service}: {command[0]} has no flag {flag}"
    mounts = _mounts(service)
    for word in command:
        if word.startswith("/certs/"):
            assert word in mounts, f"{service}: {word} is not mounted"
            host = mounts[word]
            assert host.startswith("./certs/") and (certs / host.removeprefix("./certs/")).is_file(), (
                f"{service}: {host} is not written by generate_certs.py"
            )
        if word.startswith("/state/"):
            assert "/state" in mounts


def test_superlink_certificate_names_the_compose_service_and_loopback(certs: Path) -> None:
    cert = x509.load_pem_x509_certificate((certs / "server.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "superlink" in names.get_values_for_type(x509.DNSName), "SuperNodes reach the proxy as 'superlink'"
    assert "localhost" in names.get_values_for_type(x509.DNSName), "nginx checks the SuperLink as localhost"
    config = tomllib.loads((DEPLOY / "flwr-config.toml").read_text())
    connection = config["superlink"][config["superlink"]["default"]]
    assert connection["address"] == "127.0.0.1:9092" and connection["root-certificates"] == "/certs/ca.crt"
    mounts = _mounts("flwr")
    assert mounts["/certs/ca.crt"] == "./certs/ca.crt" and mounts["/flwr-home/config.toml"] == "./flwr-config.toml"


def test_the_control_api_is_reachable_only_inside_the_superlink_host(certs: Path) -> None:
    command = _command("superlink")
    assert command[command.index("--host") + 1] == "127.0.0.1" and command[command.index("--port") + 1] == "9092"
    for name in ("proxy", "flwr"):
        assert SERVICES[name]["network_mode"] == "service:superlink", f"{name} must share the SuperLink's loopback"
    published = [port for service in SERVICES.values() for port in service.get("ports", [])]
    assert published == ["9093:9093"], "only the proxy's port is published"
    unit = shlex.split(_unit("flower-superlink.service")["Service"]["ExecStart"])
    assert unit[unit.index("--host") + 1] == "127.0.0.1" and unit[unit.index("--port") + 1] == "9092"


def test_the_proxy_passes_on_the_fleet_api_only_with_the_files_compose_mounts(certs: Path) -> None:
    conf = (DEPLOY / "nginx" / "pflower-fleet.conf").read_text()
    locations = dict(re.findall(r"location (\S+) \{(.*?)\}", conf, re.S))
    assert set(locations) == {"/v1/fleet/", "/"}
    assert "proxy_pass https://127.0.0.1:9092/v1/fleet/;" in locations["/v1/fleet/"]
    assert "proxy_ssl_verify on;" in locations["/v1/fleet/"] and "return 404;" in locations["/"]
    mounts = _mounts("proxy")
    assert mounts["/etc/nginx/conf.d/pflower-fleet.conf"] == "./nginx/pflower-fleet.conf"
    for path in sorted(set(re.findall(r"/etc/pflower/certs/[\w.]+", conf))):
        host = mounts[path]
        assert host == "./certs/" + path.rsplit("/", 1)[1] and (certs / host.removeprefix("./certs/")).is_file()


@pytest.mark.parametrize("service", ["proxy", "flwr", "supernode-0", "supernode-1"])
def test_no_service_sees_keys_it_does_not_need(service: str) -> None:
    hosts = set(_mounts(service).values())
    assert "./certs" not in hosts and "./certs/ca.key" not in hosts, f"{service} must not see the CA key"
    private = {h for h in hosts if h.startswith("./certs/nodes/") and not h.endswith(".pub")}
    assert len(private) == (1 if service.startswith("supernode") else 0), f"{service}: {sorted(private)}"
    if service != "proxy":
        assert "./certs/server.key" not in hosts


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(DEPLOY / "systemd" / name)
    return parser


def test_supernode_unit_matches_the_setup_script_and_flower() -> None:
    unit = _unit("flower-supernode.service")
    exec_start = shlex.split(unit["Service"]["ExecStart"])
    assert exec_start[0] == "/opt/pflower/.venv/bin/flower-supernode"
    for flag in [w for w in exec_start if w.startswith("--")]:
        assert flag in _flags("flower-supernode"), flag
    assert unit["Service"]["Restart"] == "always", "a crashed SuperNode must come back"
    assert unit["Service"]["EnvironmentFile"] == "/etc/pflower/supernode.env"
    script = (DEPLOY / "setup_edge.sh").read_text()
    used = set(re.findall(r"\$\{(PFL_[A-Z_]+)\}", unit["Service"]["ExecStart"]))
    written = set(re.findall(r"^(PFL_[A-Z_]+)=", script, re.M))
    assert used and used <= written, f"the unit uses {sorted(used - written)} that setup_edge.sh does not write"
    assert "PREFIX=/opt/pflower" in script


def test_superlink_unit_flags_exist() -> None:
    exec_start = shlex.split(_unit("flower-superlink.service")["Service"]["ExecStart"])
    assert exec_start[0] == "/opt/pflower/.venv/bin/flower-superlink"
    for flag in [w for w in exec_start if w.startswith("--")]:
        assert flag in _flags("flower-superlink"), flag
    assert "--enable-supernode-auth" in exec_start and "--ssl-certfile" in exec_start


def _setup(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(DEPLOY / "setup_edge.sh"), *args], capture_output=True, text=True, timeout=60)


def test_setup_script_dry_run_writes_the_node_config(tmp_path) -> None:
    key, ca = tmp_path / "node-3", tmp_path / "ca.crt"
    key.write_text("key")
    ca.write_text("ca")
    done = _setup(
        "--dry-run",
        "--superlink",
        "10.0.0.5:9093",
        "--ca",
        str(ca),
        "--key",
        str(key),
        "--partition",
        "3",
        "--partitions",
        "10",
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "pip install torch==2.9.1 torchvision==0.24.1" in out
    assert "PFL_NODE_CONFIG=\"partition-id=3 num-partitions=10 state-dir='/var/lib/pflower/state'\"" in out
    assert "PFL_SUPERLINK=10.0.0.5:9093" in out and "systemctl enable --now flower-supernode.service" in out
    assert f"-m 0600 {key} /var/lib/pflower/node.key" in out, "the private key is copied readable by its owner only"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--partition", "1"], "are required"),
        (["--superlink", "nohost", "--ca", "x", "--key", "x", "--partition", "0", "--partitions", "2"], "HOST:PORT"),
        (
            ["--superlink", "h:1", "--ca", "x", "--key", "x", "--partition", "2", "--partitions", "2"],
            "below --partitions",
        ),
        (
            [
                "--superlink",
                "h:1",
                "--ca",
                "/nonexistent/ca.crt",
                "--key",
                "x",
                "--partition",
                "0",
                "--partitions",
                "2",
            ],
            "not found",
        ),
        (["--bogus"], "unknown option"),
    ],
)
def test_setup_script_explains_bad_input(args: list[str], message: str) -> None:
    done = _setup("--dry-run", *args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr
