"""Run-config `dp` = central on the real round runner: the new global model is exactly the reference plus the
clipped, noised DP-FedAvg mean of what the clients sent, every round logs the epsilon the accountant gives, the
summary reports it, and settings that cannot give the guarantee are refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.config import parse_run_config
from common.hparams import ConfigError
from common.methods.privacy import CentralDp, epsilon
from common.seeding import derive_seed
from common.wire.messages import ARRAYS

from .inprocess import InProcessFederation

pytest.importorskip("dp_accounting")

BASE = {"dataset": "digits", "num-rounds": 3, "fraction-train": 0.5, "local-epochs": 1, "seed": 4, "eval-every": 0}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"algorithm": "fedamp"}, "cannot apply to 'fedamp': its server needs each client's own model"),
        ({"algorithm": "fliu"}, "cannot apply to 'fliu'"),
        ({"algorithm": "dmpfl"}, "not yet for 'dmpfl'"),
        ({"dp-noise-multiplier": 1.0, "dp-target-epsilon": 4.0}, "needs exactly one of"),
        ({}, "needs exactly one of"),
        ({"dp-noise-multiplier": 1.0, "robust-aggregation": "median"}, "no bounded sensitivity"),
    ],
)
def test_settings_that_cannot_keep_the_promise_are_refused(extra: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_run_config({"dp": "central", **extra})


def test_the_round_aggregate_is_the_clipped_noised_mean_and_the_epsilon_the_accountants() -> None:
    raw = {**BASE, "dp": "central", "dp-clip-norm": 0.05, "dp-noise-multiplier": 1.1, "dp-delta": 1e-4}
    fed = InProcessFederation(raw, 6)
    reference = [a.copy() for a in fed.strategy.global_arrays]
    replies = fed.train_round(1)
    uploads = [[np.asarray(a) for a in replies[pid][ARRAYS].to_numpy_ndarrays()] for pid in sorted(replies)]
    assert len(uploads) == 3
    dp = CentralDp(0.05, 1.1, 0.0, 1e-4, 3, 6, 3, derive_seed(4, "dp"))
    expected, report = dp.aggregate(uploads, reference, 0)
    for got, want in zip(fed.strategy.global_arrays, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    record = fed.round_log.train
    assert record["dp"]["clipped"] == 3, "every update of a trained MLP is longer than 0.05"
    assert record["dp"]["noise_std"] == pytest.approx(1.1 * 0.05 / 3)
    assert record["dp"]["epsilon"] == pytest.approx(epsilon(1.1, 0.5, 1, 1e-4)) == report["epsilon"]
    fed.train_round(2)
    assert fed.round_log.train["dp"]["epsilon"] == pytest.approx(epsilon(1.1, 0.5, 2, 1e-4))
    assert fed.strategy.state_dict()["dp-rounds"] == 2  # a resumed run accounts the rounds it already spent


def test_a_run_solves_the_noise_for_its_target_and_reports_the_epsilon(tmp_path: Path, capsys) -> None:
    from experiments import cli

    argv = ["run", "--set", "dp=central", "--set", "dp-target-epsilon=8", "--set", "dp-clip-norm=0.5"]
    assert cli.main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "central DP: updates clipped to 0.5, noise multiplier" in out and "(solved for epsilon 8)" in out
    run = tmp_path / "fedavg-digits-smoke" / "fedavg-digits-smoke-seed0"
    import json

    summary = json.loads((run / "summary.json").read_text())
    spent = summary["dp"]["epsilon"]
    assert summary["dp"]["rounds"] == 2 and spent <= 8.0 and spent == pytest.approx(8.0, rel=0.01)
    assert "| DP epsilon " in out.split("[round 2/2]")[1].splitlines()[0]
    assert "central DP: epsilon at delta 1e-05 after 2 rounds" in (run / "summary.md").read_text()


@pytest.mark.parametrize("algorithm", ["fedper", "lg-fedavg", "ditto"])
def test_partial_and_personal_algorithms_aggregate_their_shared_part_under_dp(algorithm: str) -> None:
    fed = InProcessFederation({**BASE, "algorithm": algorithm, "dp": "central", "dp-noise-multiplier": 1.0}, 4)
    fed.train_round(1)
    report = fed.round_log.train["dp"]
    assert report["epsilon"] == pytest.approx(epsilon(1.0, 0.5, 1, 1e-5)) and report["noise_std"] == 0.5
