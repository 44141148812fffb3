"""`pflower --help`, `keys` and `presets` answer without importing torch, Flower, SciPy or matplotlib: a typo costs
a fraction of a second, not the 8 s of importing the training stack."""

from __future__ import annotations

import subprocess
import sys

import pytest

BLOCKED = ("torch", "flwr", "scipy", "matplotlib", "ray")
PROBE = """
import sys
for name in {blocked!r}:
    sys.modules[name] = None  # `import name` now raises ImportError
from experiments.cli import main
sys.exit(main({argv!r}))
"""


@pytest.mark.parametrize(
    "argv", [["--help"], ["run", "--help"], ["sweep", "--help"], ["privacy", "--help"], ["keys"], ["presets"]]
)
def test_cli_answers_without_the_training_stack(argv: list[str]) -> None:
    probe = PROBE.format(blocked=BLOCKED, argv=argv)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_a_blocked_import_would_be_caught() -> None:
    """The probe itself can fail: a subcommand that needs torch exits non-zero with torch blocked."""
    probe = PROBE.format(blocked=BLOCKED, argv=["run", "--set", "num-rounds=1"])
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "ImportError" in done.stderr or "ModuleNotFoundError" in done.stderr
