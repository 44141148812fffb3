"""`pflower run | sweep | results --run` check every run's data, partition file and results folder, and run-config
keys, before starting anything: one line, exit 2, within a second."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.config import parse_run_config
from common.hparams import ConfigError
from experiments import cli
from experiments.cli import commands
from experiments.run.presets import preset
from experiments.run.runs import plan

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@pytest.fixture(autouse=True)
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record any engine the CLI makes (and refuse to start it): a check that fails must start none."""
    made: list[str] = []

    def refuse(name: str, *args: object, **kwargs: object) -> None:
        made.append(name)
        raise AssertionError(f"engine {name} was started")

    monkeypatch.setattr(commands, "make_engine", refuse)
    monkeypatch.setenv("PFL_CACHE_DIR", "/nonexistent-pflower-cache")  # no cached copy of MNIST counts
    return made


def _fails_fast(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI; assert exit 2 with one line on stderr, nothing on stdout; that line. (Before anything starts:
    the fixture refuses to make an engine. No wall-clock bound: a loaded machine would fail it for nothing.)"""
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize("engine", ["inprocess", "simulation"])
def test_a_missing_data_dir_stops_the_run_before_anything_starts(
    engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_starts: list[str]
) -> None:
    argv = ["run", "--dataset", "mnist", "--set", f"data-dir={tmp_path / 'nowhere'}", "--engine", engine]
    line = _fails_fast([*argv, "--seeds", "0,1,2", "--out", str(tmp_path / "out")], capsys)
    assert line.startswith("pflower: error: experiment fedavg-mnist-smoke: mnist: expected")
    assert str(tmp_path / "nowhere" / "MNIST" / "raw") in line
    assert nothing_starts == []
    assert not (tmp_path / "out").exists(), "no results folder is made for a run that cannot start"


def test_a_relative_data_dir_is_made_absolute_against_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES:
        (raw / name).write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    (spec,) = plan("e", preset("smoke"), {"dataset": "mnist", "data-dir": "data"}, [0])
    assert spec.run_config["data-dir"] == str(tmp_path / "data")

    from experiments.run.preflight import check_runs

    check_runs([spec], tmp_path / "out")  # the files are found: no error
    monkeypatch.chdir(tmp_path / "data")  # the same relative path elsewhere names another folder
    (elsewhere,) = plan("e", preset("smoke"), {"dataset": "mnist", "data-dir": "data"}, [0])
    with pytest.raises(ConfigError, match="mnist: expected"):
        check_runs([elsewhere], tmp_path / "out")


def test_a_sweep_checks_every_run_before_starting_any(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_starts: list[str]
) -> None:
    sweep = tmp_path / "s.toml"
    sweep.write_text(
        "[[experiment]]\nname = 'fine'\n\n"
        f"[[experiment]]\nname = 'broken'\ndataset = 'femnist'\ndata-dir = '{tmp_path}'\n"
    )
    for engine in ("inprocess", "simulation"):
        line = _fails_fast(["sweep", str(sweep), "--out", str(tmp_path / "out"), "--engine", engine], capsys)
        assert "experiment broken: femnist: expected" in line
    assert nothing_starts == []


def test_results_run_checks_the_runs_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_starts: list[str]
) -> None:
    sweep = tmp_path / "s.toml"
    sweep.write_text(
        f"[[experiment]]\nname = 'a'\ndataset = 'cifar10'\ndata-dir = '{tmp_path}'\n\n"
        "[[table]]\nid = 't'\nrows = ['a']\n"
    )
    argv = ["results", str(sweep), "--run", "--runs", str(tmp_path / "r"), "--out", str(tmp_path / "doc.md")]
    assert "experiment a: cifar10: expected" in _fails_fast(argv, capsys)
    assert nothing_starts == []


def test_a_missing_partition_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_starts: list[str]
) -> None:
    argv = ["run", "--set", "partition=file", "--set", f"partition-file={tmp_path / 'p.npz'}", "--engine", "inprocess"]
    line = _fails_fast([*argv, "--out", str(tmp_path / "out")], capsys)
    assert f"'partition-file' '{tmp_path / 'p.npz'}': no such file" in line


GOOD_TRAIN = [[2 * k, 2 * k + 1] for k in range(6)]  # six clients, disjoint samples of the embedded digits
GOOD_TEST = [[20 + k] for k in range(6)]


@pytest.mark.parametrize(
    ("train", "test", "said"),
    [
        (GOOD_TRAIN[:2], GOOD_TEST[:2], "holds 2 clients, the run has 6: use at most 2"),
        ([[0, 1], [1, 3], *GOOD_TRAIN[2:]], GOOD_TEST, "clients 0 and 1 both train on index 1"),
        ([[0, 99_999], *GOOD_TRAIN[1:]], GOOD_TEST, "'train_0' holds index 99999, outside 0.."),
        (GOOD_TRAIN, [[1], *GOOD_TEST[1:]], "client 0's train and test share 1 indices"),
    ],
)
def test_a_bad_partition_file_is_one_line_before_the_engine_starts(
    train: list[list[int]],
    test: list[list[int]],
    said: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    nothing_starts: list[str],
) -> None:
    """Client count, index ranges and overlaps are read from the file before anything starts (they were found only
    at the handshake, a minute and a half in)."""
    import numpy as np

    from common.data.partition_file import save_partition_file

    def indices(rows: list[list[int]]) -> list[np.ndarray]:
        return [np.array(row) for row in rows]

    file = tmp_path / "p.npz"
    save_partition_file(file, indices(train), indices(test))
    argv = ["run", "--set", "partition=file", "--set", f"partition-file={file}", "--set", "max-samples=0"]
    line = _fails_fast([*argv, "--out", str(tmp_path / "out")], capsys)
    assert line.startswith(f"pflower: error: experiment fedavg-digits-smoke: partition-file {file}: "), line
    assert said in line
    assert nothing_starts == [] and not (tmp_path / "out").exists()


def test_a_results_folder_that_cannot_be_made_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_starts: list[str]
) -> None:
    (tmp_path / "a-file").write_text("")
    line = _fails_fast(["run", "--engine", "inprocess", "--out", str(tmp_path / "a-file" / "out")], capsys)
    assert "results folder" in line and "cannot be made" in line


def test_an_unknown_key_suggests_the_nearest_instead_of_listing_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _fails_fast(["run", "--set", "fraction-trian=0.3", "--out", str(tmp_path)], capsys)
    assert "unknown run-config key 'fraction-trian': did you mean 'fraction-train'?" in line
    assert "pflower keys" in line and "num-rounds" not in line
    with pytest.raises(ConfigError, match="did you mean 'drop-rate'"):
        parse_run_config({"drop_rate": 0.1})
    with pytest.raises(ConfigError) as unknown:
        parse_run_config({"zzzz": 1})
    assert "did you mean" not in str(unknown.value)


def test_keys_lists_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["keys"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(x.startswith("fraction-train = 0.5  # ") for x in lines)
    assert any(x.startswith("drop-rate = 0.0  # ") for x in lines)


def test_the_simulation_without_ray_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys) -> None:
    """A base or server install has no Ray: `--engine simulation` names the extra to install, exit 2, at once."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    line = _fails_fast(["run", "--engine", "simulation", "--out", str(tmp_path)], capsys)
    assert "needs Flower's simulation (Ray): pip install -e '.[simulation]'" in line


def _digits_export(path: Path, webp: bool) -> None:
    """An export of 8-bit grey digits-shaped images under the name `digits`."""
    import numpy as np

    from common.data.arrays import DatasetArrays
    from experiments.run.exports import write_export

    x = np.random.default_rng(0).integers(0, 256, size=(4, 1, 8, 8), dtype=np.uint8)
    data = DatasetArrays("digits", x, np.arange(4) % 2, 2, (0.5,), (0.25,), 255.0)
    write_export(data, [0, 2], path, webp=webp)


def test_an_export_that_does_not_decode_or_holds_another_data_set_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], nothing_starts: list[str]
) -> None:
    import numpy as np

    from experiments.run.exports import CHECKSUM, _digest

    good, broken, damaged = tmp_path / "good.npz", tmp_path / "broken.npz", tmp_path / "damaged.npz"
    other = tmp_path / "other.npz"
    _digits_export(good, webp=True)
    with np.load(good) as z:
        arrays = dict(z)
    arrays["x_webp"] = arrays["x_webp"].copy()
    arrays["x_webp"][: int(arrays["x_webp_ends"][0])] = 7  # the first image's bytes are no WebP any more
    np.savez(damaged, **arrays)  # its checksum no longer matches
    np.savez(broken, **{**arrays, CHECKSUM: _digest(arrays)})  # signed again: the image itself is refused
    np.savez(other, something=np.zeros(3))
    base = ["run", "--engine", "inprocess", "--out", str(tmp_path / "out"), "--data-export"]
    line = _fails_fast([*base, str(broken)], capsys)
    assert f"data export {broken}: its first image does not decode" in line and "not a WebP image" in line
    line = _fails_fast([*base, str(damaged)], capsys)
    assert f"data export {damaged}: its checksum does not match its content" in line
    line = _fails_fast([*base, str(other)], capsys)
    assert f"data export {other}: it carries no checksum" in line and "pflower export" in line
    line = _fails_fast([*base, str(good), "--dataset", "mnist"], capsys)
    assert f"the data export {good} holds digits, the run reads mnist" in line
    assert nothing_starts == []
