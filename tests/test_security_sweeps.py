"""Names in sweep files and on the CLI that become folders are plain folder names: a sweep named '../escape' or
an absolute path is refused in one line before anything is written, never a folder outside the results one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.hparams import ConfigError
from experiments import cli
from experiments.cli import commands
from experiments.run.runs import folder_name
from experiments.run.sweep import read_sweep

REPO = Path(__file__).resolve().parents[1]


def _tree(root: Path) -> set[str]:
    """Every path under root, relative to it."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A nested working folder inside tmp_path; an engine that, if ever reached, stops the run before any work."""

    def no_engine(*_: object) -> None:
        raise ConfigError("engine reached: the name was not refused up front")

    monkeypatch.setattr(commands, "make_engine", no_engine)
    cwd = tmp_path / "work" / "here"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    return cwd


def _refused(argv: list[str], bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI exits 2 with one line naming `bad`, and tmp_path holds nothing it did not hold before."""
    before = _tree(tmp_path)
    assert cli.main(argv) == 2
    assert _tree(tmp_path) == before
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert repr(bad) in err and "plain folder name" in err


def _sweep(tmp_path: Path, head: str, experiment: str = "a") -> Path:
    path = tmp_path / "s.toml"
    path.write_text(f"{head}preset = 'smoke'\nseeds = [0]\n[[experiment]]\nname = {json.dumps(experiment)}\n")
    return path


@pytest.mark.parametrize("bad", ["../escape", "../../../escape", "..", "."])
def test_a_sweep_named_up_the_tree_is_refused_and_writes_nothing(
    bad: str, workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = _sweep(tmp_path, f"name = {json.dumps(bad)}\n")
    _refused(["sweep", str(sweep)], bad, tmp_path, capsys)
    _refused(["results", str(sweep), "--out", str(workdir / "r.md")], bad, tmp_path, capsys)
    assert not (workdir.parent / "escape").exists() and not (tmp_path / "escape").exists()


def test_a_sweep_named_by_an_absolute_path_is_refused_and_writes_nothing(
    workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = tmp_path / "outside"  # results/<absolute> would be this folder, outside ./results
    sweep = _sweep(tmp_path, f"name = {json.dumps(str(outside))}\n")
    _refused(["sweep", str(sweep)], str(outside), tmp_path, capsys)
    assert not outside.exists() and not (workdir / "results").exists()


@pytest.mark.parametrize("bad", ["../escape", "/tmp/pflower-escape", "a/b", "a\\b", "+a", ".hidden"])
def test_an_experiment_named_as_a_path_is_refused(
    bad: str, workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(["sweep", str(_sweep(tmp_path, "name = 'ok'\n", bad))], bad, tmp_path, capsys)
    _refused(["run", "--name", bad], bad, tmp_path, capsys)
    assert not Path("/tmp/pflower-escape").exists()


def test_the_cli_sets_the_run_name_itself(workdir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _tree(tmp_path)
    assert cli.main(["run", "--set", "run-name=../escape"]) == 2
    assert "'run-name' is set by the CLI" in capsys.readouterr().err
    assert _tree(tmp_path) == before


def test_a_sweep_without_name_takes_its_file_name_only_when_that_is_plain(tmp_path: Path) -> None:
    plain = tmp_path / "my_sweep.toml"
    plain.write_text("[[experiment]]\nname = 'a'\n")
    assert read_sweep(plain).name == "my_sweep"
    odd = tmp_path / "my sweep.toml"
    odd.write_text("[[experiment]]\nname = 'a'\n")
    with pytest.raises(ConfigError, match="no `name`, so its file name 'my sweep' must be a plain folder name"):
        read_sweep(odd)


def test_plain_names_pass_and_the_shipped_sweeps_stay_valid() -> None:
    for name in ("fedavg", "dmpfl-whole", "path-10-fliu-gamma0.5", "fedamp_mnist", "x" * 81):
        assert folder_name(name, "experiment name") == name
    for name in ("paper-gpu", "dmpfl+", "sweep.v2", "y" * 100):
        assert folder_name(name, "sweep name", plus=True) == name
    for bad in ("", ".", "..", "a/b", "/abs", "a\\b", "-a", "a b", "a\nb", "x" * 82, 5, None, "dmpfl+"):
        with pytest.raises(ConfigError, match="plain folder name"):
            folder_name(bad, "experiment name")
    with pytest.raises(ConfigError, match="at most 100 characters"):
        folder_name("y" * 101, "sweep name", plus=True)
    for path in sorted((REPO / "bench" / "sweeps").glob("*.toml")):
        assert read_sweep(path).name
