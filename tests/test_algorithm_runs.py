"""Each algorithm's own behaviour over whole runs (3 rounds, 6 digits clients, half of them a round): what travels,
what it reports, that it learns. On the in-process engine, inline: tests/test_engine.py requires every algorithm to
send the same messages there as in Flower's simulation, so these runs are what `flwr run` gives, without a Flower
simulation's start-up per run (tests/test_e2e_simulation.py keeps the runs that test `flwr run` itself)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from experiments.engine.serve import serve

NUM_NODES = 6
MODEL_BYTES = 9610 * 4  # the MLP's float32 parameters


def _run(results: Path, name: str, rounds: int = 3, clients: int = NUM_NODES, **overrides: Any) -> Path:
    config = {
        "results-dir": str(results),
        "run-name": name,
        "num-rounds": rounds,
        "fraction-train": 0.5,
        "local-epochs": 2,
        **{key.replace("_", "-"): value for key, value in overrides.items()},
    }
    assert serve(config, clients, inline=True), f"the {name} run failed"
    return results / name


def _rounds(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_local_sends_no_weights(tmp_path) -> None:
    last = _rounds(_run(tmp_path, "local", algorithm="local"))[-1]
    assert last["bytes"]["train_down"] < 3 * 1000 and last["bytes"]["train_up"] < 3 * 1000
    assert last["eval"]["mean"]["acc-shift-0"] > 0.3


@pytest.mark.parametrize("algorithm", ["dmpfl", "feddst"])
def test_sparse_algorithms_run_and_send_less(tmp_path, algorithm: str) -> None:
    run_dir = _run(tmp_path, algorithm, algorithm=algorithm, iterations=1, readjust_interval=2, sparsity=0.8)
    rounds = _rounds(run_dir)
    assert all(r["bytes"]["train_up"] < 3 * 0.5 * MODEL_BYTES for r in rounds), "sparse uploads"
    assert rounds[-1]["train"]["flops"] > 0
    if algorithm == "dmpfl":
        assert [r["phase"] for r in rounds] == [1, 2, 3]
        assert "plus-acc-shift-1" in rounds[-1]["eval"]["mean"]


def test_fedamp_pretrains_survives_dropped_and_late_clients_and_keeps_stale_rows(tmp_path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="flwr"):
        run_dir = _run(tmp_path, "fedamp", algorithm="fedamp", drop_rate=0.34, straggler_rate=0.34)
    rounds = _rounds(run_dir)
    assert rounds[0]["train"]["pretrain"]["used"] == NUM_NODES - 4  # 2 of 6 dropped, 2 late
    for r in rounds:
        assert r["train"]["sent"] == 3 and len(r["train"]["dropped"]) == 1 and len(r["train"]["stragglers"]) == 1
        assert r["train"]["used"] == 1 and r["train"]["failed"] == 1, "the dropped client's error reply is counted"
        assert r["train"]["late"] == 1 and r["train"]["clients"] != r["train"]["stragglers"]
        assert r["stale_rows"] == NUM_NODES - 1
    assert "(simulated straggler)" in caplog.text
    last = rounds[-1]["eval"]["mean"]
    assert last["acc-shift-0"] > 0.3 and "cloud-acc-shift-0" in last


def test_fliu_reports_its_stages(tmp_path) -> None:
    run_dir = _run(tmp_path, "fliu", algorithm="fliu", stages=True)
    assert set(_rounds(run_dir)[-1]["train"]["stages"]) == {"G", "L1", "L2"}
    summary = (run_dir / "summary.md").read_text()
    assert "| L1 |" in summary and "rho_0.95" in summary


@pytest.mark.parametrize(
    ("algorithm", "shared_params"),
    [("lg-fedavg", 1290), ("fedper", 8320), ("fedrep", 8320), ("fedbn", 9610), ("ditto", 9610), ("apfl", 9610)],
)
def test_split_and_personal_baselines_run_end_to_end(tmp_path, algorithm: str, shared_params: int) -> None:
    rounds = _rounds(_run(tmp_path, algorithm, rounds=2, algorithm=algorithm))
    assert [r["round"] for r in rounds] == [1, 2]
    last = rounds[-1]
    assert last["train"]["used"] == last["train"]["sent"] == 3 and len(last["eval"]["per_client"]) == NUM_NODES
    assert last["eval"]["mean"]["acc-shift-0"] > 0.2
    # only the shared part travels (MLP parameters: body 8,320, head 1,290; FedBN's mlp-bn shares 9,610 of 10,122)
    assert 3 * shared_params * 4 < last["bytes"]["train_up"] < 3 * (shared_params * 4 + 4000)
    if algorithm in ("ditto", "apfl"):
        assert "global-acc-shift-0" in last["eval"]["mean"]


def test_dapperfl_on_the_digit_domains_prunes_by_device(tmp_path, data_dir) -> None:
    run_dir = _run(
        tmp_path,
        "dapperfl",
        rounds=2,
        clients=10,
        fraction_train=1.0,
        algorithm="dapperfl",
        dataset="digit-domains",
        partition="domains",
        data_dir=str(data_dir),
        domain_share=0.005,
        domain_test_size=200,
        shift_degrees="0",
        batch_size=32,
    )
    by_ratio = _rounds(run_dir)[-1]["by_ratio"]
    assert list(by_ratio) == ["0", "0.2", "0.4", "0.6", "0.8"]
    assert all(len(entry["clients"]) == 2 for entry in by_ratio.values())
    values = [entry["values"] for entry in by_ratio.values()]
    assert values == sorted(values, reverse=True) and values[-1] < 0.5 * values[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    up = [summary["by_ratio"][r]["mb_up"] for r in ("0", "0.2", "0.4", "0.6", "0.8")]
    assert up == sorted(up, reverse=True) and up[-1] < 0.5 * up[0]
    assert {f"domain-{d}-acc" for d in ("mnist", "usps", "mnist-m", "syn")} <= set(summary["final"]["mean"])
    text = (run_dir / "summary.md").read_text()
    assert "global accuracy |" in text and "| 0.8 | 2 |" in text


@pytest.mark.parametrize("algorithm", ["scaffold", "feddbe"])
def test_what_travels_beside_the_model_under_secagg_learns_what_the_plain_run_learns(tmp_path, algorithm: str) -> None:
    # the same clients and batches; SCAFFOLD's changes of c_i and FedDBE's round-0 mean representations travel in the
    # masked vector: only SecAgg+'s quantization differs
    runs = {
        mode: _rounds(_run(tmp_path, f"{algorithm}-{mode}", algorithm=algorithm, fraction_train=1.0, secagg=mode))
        for mode in ("none", "secaggplus")
    }
    plain, secure = runs["none"], runs["secaggplus"]
    assert [r["train"]["used"] for r in secure] == [NUM_NODES] * 3
    assert all(r["train"]["secagg"]["survivors"] == NUM_NODES for r in secure)
    if algorithm == "scaffold":  # equal weights: the cohort's sample count is not in the sum
        assert all(r["train"]["num_examples"] == 0 for r in secure)
    else:
        assert secure[0]["train"]["pretrain"]["secagg"]["survivors"] == NUM_NODES
    for a, b in zip(plain, secure, strict=True):
        assert abs(a["eval"]["mean"]["acc-shift-0"] - b["eval"]["mean"]["acc-shift-0"]) < 0.01
    assert secure[-1]["eval"]["mean"]["acc-shift-0"] > 0.3
