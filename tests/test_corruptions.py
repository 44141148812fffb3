"""Corruption shift: the corruptions themselves, their run-config keys, the clients' metrics, the server's checks and
summary.md's table and figure."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits

from common.algorithms import SPECS
from common.config import ConfigError, parse_run_config
from common.data.arrays import DataError, DatasetArrays
from common.data.corruptions import CORRUPTIONS, SEVERITIES, corrupt, require_images
from common.learning.evaluate import corruption_key, shifted_metric_keys
from common.wire.validation import PayloadError
from server_app.limits import ReplyLimits
from server_app.replies import parse_eval_metrics
from server_app.results.shift import corruption_lines, corruption_table, plot_corruptions

from .inprocess import InProcessFederation

RANDOM = {"gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "fog"}


def _digits() -> np.ndarray:
    return load_digits().images.astype(np.uint8)[:200, None]  # values 0..16


def _images() -> list[tuple[np.ndarray, float]]:
    rng = np.random.default_rng(0)
    return [
        (_digits(), 16.0),
        (rng.integers(0, 256, (40, 1, 28, 28)).astype(np.uint8), 255.0),
        (rng.integers(0, 256, (20, 3, 32, 32)).astype(np.uint8), 255.0),
        (rng.random((10, 3, 32, 32)).astype(np.float32), 1.0),
    ]


def _distortion(x: np.ndarray, name: str, severity: int, max_value: float) -> float:
    out = corrupt(x, name, severity, np.random.default_rng(1), max_value)
    return float(np.abs(out.astype(np.float64) - x).mean() / max_value)


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_every_severity_keeps_shape_dtype_and_range_and_is_seeded(name: str) -> None:
    for x, max_value in _images():
        for severity in SEVERITIES:
            out = corrupt(x, name, severity, np.random.default_rng(7), max_value)
            assert out.shape == x.shape and out.dtype == x.dtype
            assert out.min() >= 0 and out.max() <= max_value
            again = corrupt(x, name, severity, np.random.default_rng(7), max_value)
            np.testing.assert_array_equal(out, again)
            other = corrupt(x, name, severity, np.random.default_rng(8), max_value)
            assert (not np.array_equal(out, other)) if name in RANDOM else np.array_equal(out, other)
            assert not np.array_equal(out, x), f"{name} {severity} changes the images"


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_a_higher_severity_distorts_more(name: str) -> None:
    rng = np.random.default_rng(3)
    for x in (
        rng.integers(0, 256, (64, 1, 28, 28)).astype(np.uint8),
        rng.integers(0, 256, (64, 3, 32, 32)).astype(np.uint8),
    ):
        distortion = [_distortion(x, name, s, 255.0) for s in SEVERITIES]
        assert all(b > a for a, b in zip(distortion, distortion[1:])), distortion
    # 8x8 images with 17 grey levels: some neighbouring severities coincide (pixelate keeps 7 of 8 pixels at 95%
    # and 90%); the strongest still distorts more than the mildest.
    digits = _digits()
    assert _distortion(digits, name, 5, 16.0) > _distortion(digits, name, 1, 16.0)


def test_a_higher_severity_distorts_real_mnist_more(data_dir) -> None:
    from common.data.datasets import load_dataset

    x = load_dataset("mnist", str(data_dir)).x[-300:]
    for name in CORRUPTIONS:
        distortion = [_distortion(x, name, s, 255.0) for s in SEVERITIES]
        assert all(b > a for a, b in zip(distortion, distortion[1:])), (name, distortion)


def test_keys_parse_and_bad_values_are_one_line_config_errors() -> None:
    cfg = parse_run_config({"corruptions": "all", "corruption-severities": "5,1,1"})
    assert cfg.corruptions == tuple(CORRUPTIONS) and cfg.corruption_severities == (1, 5)
    assert parse_run_config({}).corruptions == () and parse_run_config({}).corruption_severities == SEVERITIES
    assert parse_run_config({"corruptions": "Gaussian-Noise, fog"}).corruptions == ("gaussian_noise", "fog")
    for raw, message in (
        ({"corruptions": "gaussian_noise,snow"}, "unknown corruption 'snow'; allowed: all, gaussian_noise"),
        ({"corruption-severities": "6"}, "severities from 1 to 5"),
        ({"corruption-severities": "0,1"}, "severities from 1 to 5"),
        ({"corruption-severities": ""}, "severities from 1 to 5"),
        ({"corruption-eval-size": -1}, "corruption-eval-size"),
    ):
        with pytest.raises(ConfigError, match=message) as info:
            parse_run_config(raw)
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="severity 6 is not one of"):
        corrupt(_digits(), "fog", 6, np.random.default_rng(0), 16.0)
    with pytest.raises(ConfigError, match="unknown corruption 'frost'"):
        corrupt(_digits(), "frost", 1, np.random.default_rng(0), 16.0)


def test_corruptions_of_a_non_image_data_set_are_refused_in_one_line() -> None:
    series = DatasetArrays("har", np.zeros((5, 9, 128), np.float32), np.zeros(5, np.int64), 6, (0.0,), (1.0,), 1.0)
    require_images(series, ())
    with pytest.raises(DataError, match="'corruptions' applies to image data sets; 'har'") as info:
        require_images(series, ("fog",))
    assert "\n" not in str(info.value)
    with pytest.raises(DataError, match="apply to images"):
        corrupt(series.x, "fog", 1, np.random.default_rng(0), 1.0)


def _reply(keys: tuple[str, ...], degrees: tuple[float, ...]) -> dict[str, float]:
    from common.learning.evaluate import shift_key

    return {"num-test": 10, "loss": 0.5, **{shift_key(d): 0.5 for d in degrees}, **dict.fromkeys(keys, 0.25)}


def test_the_server_requires_every_configured_corruption_metric_in_range() -> None:
    cfg = parse_run_config({"corruptions": "fog,contrast", "corruption-severities": "1,5", "shift-degrees": "0"})
    keys = shifted_metric_keys(cfg.evaluation)
    assert keys == tuple(corruption_key(n, s) for n in ("fog", "contrast") for s in (1, 5))
    good = _reply(keys, cfg.shift_degrees)
    row = parse_eval_metrics({**good, "acc-corrupt-snow-3": 7.0}, cfg.shift_degrees, lambda m: {}, keys)
    assert row[corruption_key("fog", 5)] == 0.25 and "acc-corrupt-snow-3" not in row, "extra keys are ignored"
    missing = {k: v for k, v in good.items() if k != corruption_key("contrast", 5)}
    with pytest.raises(PayloadError, match="missing metric 'acc-corrupt-contrast-5'"):
        parse_eval_metrics(missing, cfg.shift_degrees, lambda m: {}, keys)
    for bad in (1.5, -0.1, float("nan"), "0.5", True):
        with pytest.raises(PayloadError, match="acc-corrupt-fog-1"):
            parse_eval_metrics({**good, corruption_key("fog", 1): bad}, cfg.shift_degrees, lambda m: {}, keys)
    assert not shifted_metric_keys(parse_run_config({}).evaluation), "off by default: nothing required"


def test_every_corruption_and_severity_fits_a_reply() -> None:
    cfg = parse_run_config(
        {
            "corruptions": "all",
            "partition": "domains",
            "dataset": "digit-domains",
            "shift-degrees": ",".join(f"{d / 20:g}" for d in range(21)),
        }
    )
    from common.algorithms import SPECS

    rows = max(len(spec.eval_rows) for spec in SPECS.values())
    values = len(shifted_metric_keys(cfg.evaluation)) + (1 + rows) * len(cfg.shift_degrees) + 10
    # DM-PFL reports 8 rows (its selector's readings and where its two models disagree): 265 values at 21 degrees,
    # a third of what a reply may carry leaves the rest for an algorithm's own metrics
    assert values < ReplyLimits(arrays=1, array_bytes=1).metrics / 3, values


def test_one_client_reports_every_corruption_key_the_same_way_twice() -> None:
    from common.data import evalsets

    from .inprocess import InProcessFederation

    raw = {"algorithm": "fedavg", "corruptions": "all", "shift-degrees": "0,0.5", "num-rounds": 1, "local-epochs": 1}
    fed = InProcessFederation(raw, 3)
    fed.train_round(1)
    first = fed.evaluate(1)[0].metric_records["metrics"]
    keys = [corruption_key(n, s) for n in CORRUPTIONS for s in SEVERITIES]
    assert all(0.0 <= first[k] <= 1.0 for k in keys)
    assert set(keys) <= set(fed.round_log.eval["mean"]), "the server keeps them: per client, mean and std"
    assert fed.round_log.eval["failed"] == 0
    assert first[corruption_key("fog", 5)] < first["acc-shift-0"], "heavy fog costs accuracy"
    evalsets._CORRUPTED.clear()  # rebuilt from the seeds: the same images, the same metrics
    again = fed.evaluate(1)[0].metric_records["metrics"]
    assert [first[k] for k in keys] == [again[k] for k in keys]


def test_one_client_evaluates_a_seeded_subset_when_asked() -> None:
    from common.data.evalsets import corrupted_test

    cfg = parse_run_config({"corruptions": "fog", "corruption-severities": "2", "corruption-eval-size": 20})
    sets = corrupted_test(cfg.data, 1, 3)
    x, y = sets[("fog", 2)]
    assert x.shape[0] == 20 and y.shape == (20,) and x.dtype.is_floating_point
    again = corrupted_test(cfg.data, 1, 3)[("fog", 2)]
    assert bool((again[0] == x).all()) and bool((again[1] == y).all())


def _final() -> dict:
    mean = {
        "acc-shift-0": 0.9,
        corruption_key("fog", 1): 0.8,
        corruption_key("fog", 3): 0.5,
        corruption_key("gaussian_noise", 1): 0.85,
        corruption_key("gaussian_noise", 3): 0.6,
    }
    std = {k: 0.01 for k in mean}
    return {"mean": mean, "std": std, "num_clients": 3}


def test_summary_table_and_figure_hold_the_final_numbers(tmp_path) -> None:
    summary = {"final": _final(), "final_round": 4, "algorithm": "fedavg", "dataset": "digits"}
    assert list(corruption_table(summary["final"])) == ["gaussian_noise", "fog"], "the registry's order"
    lines = corruption_lines(summary)
    assert "Clean: 90.00 +/- 1.00." in lines[0]
    assert "| corruption | severity 1 | severity 3 | mean |" in lines
    assert "| fog | 80.00 +/- 1.00 | 50.00 +/- 1.00 | 65.00 |" in lines
    assert "| gaussian_noise | 85.00 +/- 1.00 | 60.00 +/- 1.00 | 72.50 |" in lines
    assert corruption_lines({"final": {"mean": {"acc-shift-0": 0.9}, "std": {}}}) == []
    plot_corruptions(summary, tmp_path)
    assert (tmp_path / "accuracy_vs_corruption.png").stat().st_size > 10_000


@pytest.mark.parametrize("algorithm", sorted(SPECS))
def test_every_algorithm_reports_the_corruptions_and_the_server_keeps_them(algorithm: str) -> None:
    raw = {
        "algorithm": algorithm,
        "dataset": "digits",
        "num-rounds": 2,
        "fraction-train": 1.0,
        "local-epochs": 1,
        "corruptions": "gaussian_noise,contrast",
        "corruption-severities": "2",
        "corruption-eval-size": 20,
    }
    if algorithm == "dapperfl":
        raw["model"] = "mlp"
    fed = InProcessFederation(raw, 3)
    if fed.strategy.warmup_round():
        fed.warmup()
    fed.train_round(1)
    fed.evaluate(1)
    stats = fed.round_log.eval
    assert stats is not None and stats["failed"] == 0 and stats["num_clients"] == 3
    for key in ("acc-corrupt-gaussian_noise-2", "acc-corrupt-contrast-2"):
        assert 0.0 <= stats["mean"][key] <= 1.0
