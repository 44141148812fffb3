"""The deployment recipes, checked where Docker and systemd cannot run: the compose file against the certificate
script and Flower's own flags, the systemd units against the set-up script, the set-up script's dry run."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import ssl
import subprocess
import sys
import threading
import tomllib
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml
from cryptography import x509

from .conftest import REPO
from .harness.deployment import FleetProxy, nginx_binary

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


def test_the_superlinks_checkpoint_key_lives_on_its_state_volume() -> None:
    """Not in the container's home (lost when it is recreated: resume would then refuse every checkpoint), and not
    beside the run folders it vouches for."""
    key_dir = Path(SERVICES["superlink"]["environment"]["PFL_KEY_DIR"])
    volumes = {Path(container): host for container, host in _mounts("superlink").items() if host in COMPOSE["volumes"]}
    assert any(key_dir.is_relative_to(mount) for mount in volumes), f"{key_dir} is on no named volume"
    assert not key_dir.is_relative_to("/results")


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
    assert command[0] == "pflower-superlink", "the SuperLink with the store bound (server_app/linkguard.py)"
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
    assert "proxy_pass https://pflower_superlink/v1/fleet/;" in locations["/v1/fleet/"]
    # each port once: the SuperLink's in the upstream block, the devices' in `listen`
    assert re.findall(r"upstream pflower_superlink \{\s*server ([\d.:]+);", conf) == ["127.0.0.1:9092"]
    assert re.findall(r"^\s*listen (\S+) ssl", conf, re.M) == ["9093"] and conf.count("9092;") == 1
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


def _bind_sources(service: str) -> list[Path]:
    """The host paths of a service's bind mounts (named volumes and ${VAR} defaults aside), resolved as compose
    does: relative to the compose file's folder."""
    hosts = [h for h in _mounts(service).values() if h.startswith((".", "/"))]
    return [(DEPLOY / h).resolve() for h in hosts]


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_no_service_mounts_a_folder_that_holds_the_certificates(service: str) -> None:
    certs = (DEPLOY / "certs").resolve()
    for source in _bind_sources(service):
        assert not certs.is_relative_to(source), f"{service} mounts {source}, which holds {certs} (every key)"
        if source.is_relative_to(certs):
            name = source.relative_to(certs).as_posix()
            assert name == "ca.crt" or name.endswith(".pub") or service != "flwr", f"flwr sees {name}"


def _project_packages() -> set[str]:
    return {p.parent.name for p in REPO.glob("*/__init__.py")}


def _imported_packages(folder: Path) -> set[str]:
    """The project's own top-level packages that the Python files under folder import."""
    found = set()
    for path in folder.rglob("*.py"):
        found |= set(re.findall(r"^\s*(?:from|import) ([A-Za-z_]\w*)", path.read_text(), re.M))
    return found & _project_packages()


def test_the_flwr_service_mounts_the_app_source_and_nothing_else_of_the_checkout() -> None:
    mounts = _mounts("flwr")
    project = {c: h for c, h in mounts.items() if c.startswith("/app/project")}
    assert "/app/project" not in project, "the whole checkout (deploy/certs, .git, results) is not mounted"
    assert project.pop("/app/project/pyproject.toml") == "../pyproject.toml"
    packages = {c.removeprefix("/app/project/"): h for c, h in project.items()}
    assert all(h == f"../{name}" and (REPO / name / "__init__.py").is_file() for name, h in packages.items()), packages
    app = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["components"]
    needed = {ref.split(".")[0] for ref in app.values()}
    while True:  # and every project package they import, transitively
        more = set().union(*(_imported_packages(REPO / name) for name in needed)) - needed
        if not more:
            break
        needed |= more
    assert set(packages) == needed, f"mounted {sorted(packages)}, the app imports {sorted(needed)}"
    for volume in SERVICES["flwr"]["volumes"]:
        assert volume.endswith(":ro"), f"flwr: {volume} is not read-only"


def test_the_app_packed_from_the_flwr_service_mounts_is_a_valid_fab(tmp_path: Path) -> None:
    import io
    import shutil
    import zipfile

    from flwr.cli.build import build_fab_from_disk

    for container, host in _mounts("flwr").items():
        if container.startswith("/app/project/"):
            source, target = (DEPLOY / host).resolve(), tmp_path / container.removeprefix("/app/project/")
            if source.is_dir():
                shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(source, target)
    names = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(tmp_path))).namelist()
    assert {"server_app/app.py", "client_app/app.py", "pyproject.toml"} <= set(names)
    assert not any(n.startswith(("deploy/", "tests/", "bench/")) for n in names)


def _proxy_conf() -> str:
    return (DEPLOY / "nginx" / "pflower-fleet.conf").read_text()


def _directive(conf: str, name: str) -> str:
    found = re.findall(rf"^\s*{name}\s+([^;]+);", conf, re.M)
    assert len(found) == 1, f"{name}: {found}"
    return found[0].strip()


def _mebibytes(value: str) -> int:
    assert re.fullmatch(r"\d+m", value), value
    return int(value[:-1]) * 1024 * 1024


BODY_LIMIT = 6 * 1024 * 1024  # deploy/nginx/pflower-fleet.conf's client_max_body_size


def _largest_fleet_request(array_bytes: int) -> int:
    """The largest Fleet API request body a SuperNode sends for a reply holding one float32 array of this size:
    one PushObject request per object, arrays cut into Flower's chunks."""
    import numpy as np
    from flwr.app import ArrayRecord, MetricRecord, RecordDict
    from flwr.proto.message_pb2 import PushObjectRequest
    from flwr.proto.node_pb2 import Node
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    record = RecordDict(
        {"arrays": ArrayRecord([np.ones(array_bytes // 4, np.float32)]), "metrics": MetricRecord({"n": 1})}
    )
    return max(
        len(
            PushObjectRequest(
                node=Node(node_id=2**63 - 1),
                run_id=2**63 - 1,
                object_id="f" * 64,
                object_content=item.deflate(),
                session_id="s" * 64,
            ).SerializeToString()
        )
        for item in get_all_nested_objects(record).values()
    )


def test_nginx_bounds_what_an_unauthenticated_request_makes_it_hold() -> None:
    conf = _proxy_conf()
    limit = _mebibytes(_directive(conf, "client_max_body_size"))
    assert limit == BODY_LIMIT, "update BODY_LIMIT, deploy/README.md and the conf's comment together"
    assert _mebibytes(_directive(conf, "client_body_buffer_size")) <= limit
    assert "proxy_request_buffering off" not in conf, "nginx, not the SuperLink, waits for a slow sender"
    # a model of any size still fits: the resnet10's 9.4 MB layer (the largest shipped) and a 40 MB one
    for array_bytes in (9_437_184, 40_000_000):
        assert _largest_fleet_request(array_bytes) <= limit - 512 * 1024
    zones = dict(re.findall(r"^limit_(conn|req)_zone \$binary_remote_addr zone=(\w+):", conf, re.M))
    assert set(zones) == {"conn", "req"}, "per-address zones for limit_conn and limit_req"
    assert int(_directive(conf, f"limit_conn {zones['conn']}")) <= 32
    assert _directive(conf, "limit_req").startswith(f"zone={zones['req']} ")
    assert "limit_conn_status" not in conf and "limit_req_status" not in conf, "503: SuperNodes retry it"


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


def test_the_warm_unit_runs_the_supernode_and_its_clientapp_as_a_pair() -> None:
    warm, cold = _unit("flower-supernode-warm.service"), _unit("flower-supernode.service")
    exec_start = shlex.split(warm["Service"]["ExecStart"])
    assert exec_start[:5] == [
        "/opt/pflower/warm-supernode.sh",
        "--runtime-port",
        "9094",
        "--bin",
        "/opt/pflower/.venv/bin",
    ]
    passed = exec_start[exec_start.index("--") + 1 :]
    for flag in [w for w in passed if w.startswith("--")]:
        assert flag in _flags("flower-supernode"), flag
    assert "--isolation" not in passed and "--port" not in passed, "the pair script sets them"
    cold_passed = shlex.split(cold["Service"]["ExecStart"])[1:]
    assert [w for w in passed if w.startswith("${")] == [w for w in cold_passed if w.startswith("${")]
    for key in ("EnvironmentFile", "User", "ReadWritePaths", "Restart"):
        assert warm["Service"][key] == cold["Service"][key], key
    environment = re.findall(
        r"^Environment=(.*)$", (DEPLOY / "systemd" / "flower-supernode-warm.service").read_text(), re.M
    )
    assert "FLWR_HOME=/var/lib/pflower/flwr-home" in " ".join(environment).split()


def _fake_pair(
    tmp_path: Path, clientapp: str, cgroup: Path | None = None, supernode_first: str = "", *options: str
) -> subprocess.Popen:
    """deploy/warm-supernode.sh over stand-ins: a SuperNode that records its arguments and waits, a ClientApp."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "flower-supernode").write_text(
        f'#!/bin/sh\n{supernode_first}\necho $$ > {tmp_path}/pid\necho "$@" > {tmp_path}/args\nexec sleep 60\n'
    )
    (bin_dir / "pflower-clientapp").write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/clientapp-args\n{clientapp}\n')
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    script = str(DEPLOY / "warm-supernode.sh")
    command = [script, "--runtime-port", "9111", "--bin", str(bin_dir), *options, "--", "--superlink", "h:1"]
    env = {**os.environ, "WARM_SUPERNODE_MEMORY_CGROUP": str(cgroup or tmp_path / "no-cgroup")}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_the_pair_ends_when_its_clientapp_dies(tmp_path: Path) -> None:
    pair = _fake_pair(tmp_path, "sleep 0.5; exit 3")
    _, err = pair.communicate(timeout=30)
    assert pair.returncode == 3 and "the ClientApp exited (status 3)" in err
    assert (tmp_path / "args").read_text().split() == ["--superlink", "h:1", "--isolation", "process", "--port", "9111"]
    clientapp = (tmp_path / "clientapp-args").read_text().split()
    assert clientapp[:4] == ["--runtime-api-address", "127.0.0.1:9111", "--insecure", "--parent-pid"]
    supernode = int((tmp_path / "pid").read_text())
    with pytest.raises(ProcessLookupError):  # the SuperNode of a dead ClientApp is stopped (and reaped)
        os.kill(supernode, 0)


def test_a_clientapp_killed_for_memory_is_named_with_the_limit(tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (cgroup / "memory.max").write_text(f"{512 * 2**20}\n")
    # the kernel's OOM killer, as the cgroup records it: one more kill, then SIGKILL
    pair = _fake_pair(tmp_path, f'sleep 0.3; echo "oom_kill 2" > {cgroup}/memory.events; kill -9 $$', cgroup)
    _, err = pair.communicate(timeout=30)
    assert pair.returncode == 137 and "for lack of memory (its memory limit: 512 MB)" in err, err
    (tmp_path / "other").mkdir()
    quiet = _fake_pair(tmp_path / "other", "kill -9 $$", cgroup)
    _, err = quiet.communicate(timeout=30)
    assert quiet.returncode == 137 and "lack of memory" not in err, f"a kill the cgroup did not count is not OOM: {err}"


def test_a_supernode_that_ignores_sigterm_is_killed_so_the_pair_can_restart(tmp_path: Path) -> None:
    pair = _fake_pair(tmp_path, "sleep 0.3; exit 3", None, "trap '' TERM", "--stop-seconds", "1")
    _, err = pair.communicate(timeout=30)  # before the deadline it waited for the SuperNode's own 60 s
    assert pair.returncode == 3 and "did not stop within 1 s of SIGTERM; killing it" in err, err
    with pytest.raises(ProcessLookupError):
        os.kill(int((tmp_path / "pid").read_text()), 0)


def test_a_pair_that_exits_cleanly_still_asks_for_a_restart(tmp_path: Path) -> None:
    pair = _fake_pair(tmp_path, "exit 0")
    _, err = pair.communicate(timeout=30)
    assert pair.returncode == 1 and "stopping the other" in err


def test_the_pair_explains_bad_input() -> None:
    for args, message in (
        (["--runtime-port", "x"], "must be a port number"),
        (["--stop-seconds", "0"], "--stop-seconds must be a whole number of seconds >= 1"),
        (["--bogus"], "unknown option"),
    ):
        done = subprocess.run([str(DEPLOY / "warm-supernode.sh"), *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 2 and message in done.stderr


def test_superlink_unit_flags_exist() -> None:
    exec_start = shlex.split(_unit("flower-superlink.service")["Service"]["ExecStart"])
    assert exec_start[0] == "/opt/pflower/.venv/bin/pflower-superlink", "the SuperLink with the store bound"
    flags = _flags("pflower-superlink")
    assert {"--max-message-objects", "--database", "--enable-supernode-auth"} <= flags, "ours, then Flower's"
    for flag in [w for w in exec_start if w.startswith("--")]:
        assert flag in flags, flag
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
    pip_lines = [line for line in out.splitlines() if "/pip install" in line]
    assert pip_lines == [f"+ /opt/pflower/.venv/bin/pip install {REPO}"], "one resolution: the pins pick torch"
    assert "install -d -o pflower -g pflower -m 0750 /var/lib/pflower/data" in out, "PFL_DATA_DIR is created"
    assert "PFL_DATA_DIR=/var/lib/pflower/data" in out
    assert "PFL_NODE_CONFIG=\"partition-id=3 num-partitions=10 state-dir='/var/lib/pflower/state'\"" in out
    assert "PFL_SUPERLINK=10.0.0.5:9093" in out and "systemctl enable flower-supernode.service" in out
    assert f"-m 0600 {key} /var/lib/pflower/node.key" in out, "the private key is copied readable by its owner only"
    warm_unit = f"{REPO}/deploy/systemd/flower-supernode-warm.service /etc/systemd/system/flower-supernode.service"
    assert warm_unit in out and "/opt/pflower/warm-supernode.sh" in out, "the long-lived ClientApp by default"
    cold = _setup("--dry-run", "--superlink", "h:1", "--ca", str(ca), "--key", str(key), "--partition", "0",
                  "--partitions", "2", "--clientapp", "cold", "--python", "python3")  # fmt: skip
    assert cold.returncode == 0, cold.stderr
    cold_unit = f"{REPO}/deploy/systemd/flower-supernode.service /etc/systemd/system/flower-supernode.service"
    assert cold_unit in cold.stdout and "warm-supernode.sh" not in cold.stdout
    assert "+ python3 -m venv /opt/pflower/.venv" in cold.stdout


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
        (
            [
                "--superlink",
                "h:1",
                "--ca",
                __file__,
                "--key",
                __file__,
                "--partition",
                "0",
                "--partitions",
                "2",
                "--clientapp",
                "hot",
            ],
            "must be warm or cold",
        ),  # fmt: skip
    ],
)
def test_setup_script_explains_bad_input(args: list[str], message: str) -> None:
    done = _setup("--dry-run", *args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def _readme_section(title: str) -> str:
    text = (DEPLOY / "README.md").read_text()
    found = re.search(rf"^## \d+\. {title}\n(.*?)(?=^## )", text, re.M | re.S)
    assert found, title
    return found.group(1)


def test_the_readme_says_every_local_user_reaches_the_control_api_and_what_the_operator_does() -> None:
    recipe = " ".join(_readme_section("SuperLink on loopback, nginx in front of it").split())
    assert "open to every local user of the SuperLink's host" in recipe
    for remedy in ("a host (or VM) of its own", "its own network namespace", "meta skuid"):
        assert remedy in recipe, remedy
    rows = [line for line in _readme_section("Security model").splitlines() if line.startswith("| local user")]
    assert any("SuperLink's host" in row and "127.0.0.1:9092" in row for row in rows), rows
    assert any("Docker host" in row for row in rows), "the compose recipe's namespace keeps them out"


def test_the_readme_quotes_the_bounds_nginx_sets() -> None:
    conf, text = _proxy_conf(), (DEPLOY / "README.md").read_text()
    mib = _mebibytes(_directive(conf, "client_max_body_size")) // 2**20
    conns = _directive(conf, "limit_conn pflower_fleet_conn")
    model = _readme_section("Security model")
    assert f"request body of at most {mib} MiB" in model and f"at most {conns} requests in progress" in model
    assert f"request body of at most {mib} MiB" in " ".join(text.split()), "section 2 says it too"
    assert "sees the CA certificate and the nodes' public keys, no private key" not in text
    assert "`deploy/certs` is not mounted" in model


class _Upstream(BaseHTTPRequestHandler):
    """A stand-in SuperLink: answers every POST with the size of the body it received."""

    sizes: list[int] = []

    def do_POST(self) -> None:
        size = int(self.headers.get("content-length", 0))
        self.rfile.read(size)
        self.sizes.append(size)
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_: object) -> None:
        """Quiet."""


@pytest.mark.skipif(nginx_binary() is None, reason="nginx is not installed (Debian: apt-get install nginx)")
def test_nginx_passes_the_largest_fleet_request_and_refuses_a_larger_body(certs: Path, tmp_path: Path) -> None:
    _Upstream.sizes.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(certs / "server.pem", certs / "server.key")
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = FleetProxy(tmp_path, certs, server.server_address[1]).start()
    try:
        trust = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        url = f"https://127.0.0.1:{proxy.port}/v1/fleet/push-object"
        largest = _largest_fleet_request(9_437_184)
        codes = [httpx.post(url, content=bytes(n), verify=trust, timeout=60).status_code for n in (largest, BODY_LIMIT)]
        assert codes == [200, 200] and _Upstream.sizes == [largest, BODY_LIMIT]
        for size in (BODY_LIMIT + 1, 64 * 1024 * 1024):
            assert httpx.post(url, content=bytes(size), verify=trust, timeout=60).status_code == 413
        assert _Upstream.sizes == [largest, BODY_LIMIT], "a body over the limit never reaches the SuperLink"
    finally:
        proxy.stop()
        server.shutdown()
        server.server_close()


def test_the_recipes_run_weight_averaging_algorithms_with_norm_clipping() -> None:
    """The recommended deployment mode (`clip`) is what every weight-averaging command of the recipes sets, every
    command of a sample-weighted algorithm caps a client's weight (`max-weight-ratio=4`), each command's run config
    parses, and each passes the deployment's protection check as written."""
    from common.algorithms import SPECS
    from common.config import parse_run_config
    from experiments.run.runs import parse_assignment
    from server_app.app import unprotected_deployment

    text = (DEPLOY / "README.md").read_text()
    commands = re.findall(r'flwr run [^\n]*?deploy --stream \\?\s*--run-config "([^"<]+)"', text)
    averaging = []
    for command in commands:
        raw = dict(parse_assignment(item) for item in command.split())
        spec = SPECS[str(raw.get("algorithm", "fedavg"))]
        assert unprotected_deployment(parse_run_config(raw)) is None, command
        if spec.averages_models or spec.averages_updates:
            assert raw.get("max-weight-ratio") == 4, command  # a device's declared count buys little
        if spec.averages_models:
            averaging.append(raw)
            assert raw.get("robust-aggregation") == "clip", command
            assert parse_run_config(raw).robust_rule.method == "clip"
    assert averaging, "no weight-averaging command found in deploy/README.md"


def test_the_loopback_proxy_scales_the_per_address_limits_to_the_supernodes_behind_one_address(tmp_path: Path) -> None:
    """Every loopback SuperNode comes from 127.0.0.1 (the NAT case): the harness multiplies the shipped per-address
    limits by their number; one node per address keeps the shipped file's values."""
    shipped = FleetProxy(tmp_path, tmp_path, 9092).config()
    assert "limit_conn pflower_fleet_conn 16;" in shipped and "rate=50r/s" in shipped and "burst=500 " in shipped
    assert "worker_connections 256;" in shipped
    scaled = FleetProxy(tmp_path, tmp_path, 9092, nodes_per_address=20).config()
    assert "limit_conn pflower_fleet_conn 320;" in scaled and "rate=1000r/s" in scaled and "burst=10000 " in scaled
    assert "worker_connections 320;" in scaled
