"""The install split: the base set is what a SuperNode needs, and the ClientApp imports nothing from an extra."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DEVICE_SET = {
    "flwr==1.42.0",
    "torch==2.14.1; platform_machine == 'x86_64'",
    "torchvision==0.29.1; platform_machine == 'x86_64'",
    "torch==2.9.1; platform_machine == 'aarch64'",
    "torchvision==0.24.1; platform_machine == 'aarch64'",
    "numpy>=2.0,<3",
    "scikit-learn>=1.4",
}
# top-level modules of distributions that only extras bring
EXTRA_ONLY_MODULES = (
    "ray",
    "datasets",
    "pyarrow",
    "pandas",
    "matplotlib",
    "flwr_datasets",
    "tensorboard",
    "mlflow",
    "flwr.simulation",
)
AARCH64 = ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp"] + [
    arg for tag in ("manylinux_2_28", "manylinux_2_17", "manylinux2014") for arg in ("--platform", f"{tag}_aarch64")
]


def _project() -> dict:
    """The [project] table of pyproject.toml."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_base_requirements_are_the_device_set() -> None:
    assert set(_project()["dependencies"]) == DEVICE_SET


def test_simulation_and_partitioners_are_extras_that_test_pulls() -> None:
    extras = _project()["optional-dependencies"]
    assert "flwr[simulation]==1.42.0" in extras["simulation"]
    assert "flwr-datasets==0.6.1" in extras["simulation"]
    assert {"tensorboard>=2.21", "mlflow-skinny>=3.17"} <= set(extras["tracking"])
    assert "pflower[server,simulation]" in extras["study"]
    assert "pflower[study,tracking]" in extras["test"]


def test_client_app_imports_nothing_from_an_extra() -> None:
    probe = (
        f"import json, sys, client_app.app; print(json.dumps([m for m in {EXTRA_ONLY_MODULES!r} if m in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def _index_reachable() -> bool:
    """Whether pypi.org answers a TCP connection within 3 s."""
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
    except OSError:
        return False
    return True


@pytest.mark.index
def test_device_set_resolves_for_aarch64(tmp_path: Path) -> None:
    """The aarch64 pins exist as Python 3.11 wheels for glibc >= 2.28, and the rest of the set resolves there.

    pip evaluates environment markers for this machine, not the target (torch's CUDA dependencies are marked
    x86_64), so torch/torchvision are checked as wheels and the rest of the set is resolved with its dependencies.
    """
    if not _index_reachable():
        pytest.skip("package index (pypi.org:443) not reachable: cannot check the aarch64 wheels")
    base = [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--target", str(tmp_path), *AARCH64]
    wheels = subprocess.run(
        [*base, "--no-deps", "torch==2.9.1", "torchvision==0.24.1"], capture_output=True, text=True, timeout=300
    )
    assert wheels.returncode == 0, wheels.stderr[-2000:]
    others = [r for r in DEVICE_SET if not r.startswith("torch")]
    rest = subprocess.run([*base, *others], capture_output=True, text=True, timeout=300)
    assert rest.returncode == 0, rest.stderr[-2000:]


def test_iid_shards_without_flwr_datasets_match_its_partitioner(monkeypatch: pytest.MonkeyPatch) -> None:
    from common.data.partition import iid

    labels = np.random.default_rng(1).integers(0, 10, 1003)
    with_partitioner = iid(labels, 7, seed=3)
    monkeypatch.setitem(sys.modules, "flwr_datasets.partitioner", None)  # import now raises ImportError
    without = iid(labels, 7, seed=3)
    assert [len(p) for p in without] == [144] * 2 + [143] * 5
    assert all(np.array_equal(a, b) for a, b in zip(with_partitioner, without, strict=True))
