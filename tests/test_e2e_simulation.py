"""End to end through `flwr run` on a private local SuperLink: results files, accuracy, determinism, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import REPO
from .harness.local_superlink import LocalSuperLink

pytestmark = pytest.mark.e2e
NUM_NODES = 6


@pytest.fixture(scope="module")
def superlink(tmp_path_factory):
    link = LocalSuperLink(tmp_path_factory.mktemp("flwr-home")).start()
    yield link
    link.stop()


def _run(superlink: LocalSuperLink, results: Path, name: str, overrides: str = "", rounds: int = 3):
    config = (
        f"results-dir='{results}' run-name='{name}' num-rounds={rounds} fraction-train=0.5 local-epochs=2 {overrides}"
    )
    return superlink.run(REPO, config, num_supernodes=NUM_NODES)


def _rounds(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _outcome_ok(outcome) -> None:
    assert outcome.status == "finished:completed", outcome.output[-3000:]


def test_fedavg_run_writes_results_and_learns(superlink, tmp_path) -> None:
    outcome = _run(superlink, tmp_path, "fedavg")
    _outcome_ok(outcome)
    run_dir = tmp_path / "fedavg"
    for name in (
        "config.json",
        "metrics.jsonl",
        "summary.md",
        "summary.json",
        "accuracy_vs_round.png",
        "accuracy_vs_shift.png",
    ):
        assert (run_dir / name).is_file(), name
    assert f"summary: {(run_dir / 'summary.md').resolve()}" in outcome.output
    rounds = _rounds(run_dir)
    assert [r["round"] for r in rounds] == [1, 2, 3]
    last = rounds[-1]
    assert last["train"]["used"] == last["train"]["sent"] == 3
    assert len(last["eval"]["per_client"]) == NUM_NODES
    assert last["eval"]["mean"]["acc-shift-0"] > 0.6, "FedAvg on digits should learn in 3 rounds"
    # bytes: 3 clients x (model down + model up); the MLP has 9,610 float32 parameters; Flower adds
    # object headers (npy headers, object ids) of a few KB per message
    model_bytes = 9610 * 4
    assert 3 * model_bytes < last["bytes"]["train_down"] < 3 * (model_bytes + 4000)
    assert 3 * model_bytes < last["bytes"]["train_up"] < 3 * (model_bytes + 4000)
    summary = (run_dir / "summary.md").read_text()
    assert "| accuracy |" in summary and "training upload per client" in summary


def test_same_seed_same_metrics(superlink, tmp_path) -> None:
    first, second = _run(superlink, tmp_path, "a", "seed=7"), _run(superlink, tmp_path, "b", "seed=7")
    _outcome_ok(first)
    _outcome_ok(second)
    a, b = _rounds(tmp_path / "a"), _rounds(tmp_path / "b")
    assert [r["train"] for r in a] == [r["train"] for r in b]
    assert [r["eval"] for r in a] == [r["eval"] for r in b]
    # message metadata carries random run/node/message ids, so sizes may differ by a few bytes
    for ra, rb in zip(a, b):
        for kind, size in ra["bytes"].items():
            assert abs(size - rb["bytes"][kind]) <= 64 * NUM_NODES, kind


def test_local_sends_no_weights(superlink, tmp_path) -> None:
    outcome = _run(superlink, tmp_path, "local", "algorithm='local'")
    _outcome_ok(outcome)
    last = _rounds(tmp_path / "local")[-1]
    assert last["bytes"]["train_down"] < 3 * 1000 and last["bytes"]["train_up"] < 3 * 1000
    assert last["eval"]["mean"]["acc-shift-0"] > 0.3


@pytest.mark.parametrize("algorithm", ["dmpfl", "feddst"])
def test_sparse_algorithms_run_and_send_less(superlink, tmp_path, algorithm: str) -> None:
    outcome = _run(
        superlink, tmp_path, algorithm, f"algorithm='{algorithm}' iterations=1 readjust-interval=2 sparsity=0.8"
    )
    _outcome_ok(outcome)
    rounds = _rounds(tmp_path / algorithm)
    model_bytes = 9610 * 4
    assert all(r["bytes"]["train_up"] < 3 * 0.5 * model_bytes for r in rounds), "sparse uploads"
    assert rounds[-1]["train"]["flops"] > 0
    if algorithm == "dmpfl":
        assert [r["phase"] for r in rounds] == [1, 2, 3]
        assert "plus-acc-shift-1" in rounds[-1]["eval"]["mean"]


def test_bad_config_value_fails_with_one_clear_line(superlink, tmp_path) -> None:
    outcome = _run(superlink, tmp_path, "bad", "partition='random'")
    assert outcome.status == "finished:failed"
    assert (
        "run-config 'partition' = 'random' is not valid; allowed values: iid, dirichlet, pathological, ls, qs, "
        "lsqs, grouped"
    ) in outcome.output
    assert "Traceback" not in outcome.output


def test_a_partition_the_data_cannot_feed_fails_once_in_one_line(superlink, tmp_path) -> None:
    outcome = _run(superlink, tmp_path, "toofew", f"max-samples={NUM_NODES}")
    assert outcome.status == "finished:failed"
    reason = (
        f"{NUM_NODES} clients for {NUM_NODES} samples: each client needs at least 2; use at most "
        f"{NUM_NODES // 2} clients"
    )
    assert f"no client answered the handshake: {reason}" in outcome.output
    assert outcome.output.count(reason) == 1 and "Traceback" not in outcome.output


def test_missing_data_fails_naming_the_files(superlink, tmp_path) -> None:
    outcome = _run(superlink, tmp_path, "nodata", f"dataset='cifar10' data-dir='{tmp_path / 'empty'}'")
    assert outcome.status == "finished:failed"
    assert (
        f"cifar10: expected data_batch_1..5 and test_batch in {tmp_path / 'empty' / 'cifar-10-batches-py'}"
        in outcome.output
    )
    assert "Traceback" not in outcome.output


def test_fedamp_pretrains_survives_dropped_and_late_clients_and_keeps_stale_rows(superlink, tmp_path) -> None:
    outcome = _run(superlink, tmp_path, "fedamp", "algorithm='fedamp' drop-rate=0.34 straggler-rate=0.34")
    _outcome_ok(outcome)
    rounds = _rounds(tmp_path / "fedamp")
    assert rounds[0]["train"]["pretrain"]["used"] == NUM_NODES - 4  # 2 of 6 dropped, 2 late
    for r in rounds:
        assert r["train"]["sent"] == 3 and len(r["train"]["dropped"]) == 1 and len(r["train"]["stragglers"]) == 1
        assert r["train"]["used"] == 1 and r["train"]["failed"] == 1, "the dropped client's error reply is counted"
        assert r["train"]["late"] == 1 and r["train"]["clients"] != r["train"]["stragglers"]
        assert r["stale_rows"] == NUM_NODES - 1
    assert "simulated" in outcome.output
    last = rounds[-1]["eval"]["mean"]
    assert last["acc-shift-0"] > 0.3 and "cloud-acc-shift-0" in last


def test_fliu_reports_its_stages(superlink, tmp_path) -> None:
    outcome = _run(superlink, tmp_path, "fliu", "algorithm='fliu' stages=true")
    _outcome_ok(outcome)
    rounds = _rounds(tmp_path / "fliu")
    assert set(rounds[-1]["train"]["stages"]) == {"G", "L1", "L2"}
    summary = (tmp_path / "fliu" / "summary.md").read_text()
    assert "| L1 |" in summary and "rho_0.95" in summary


@pytest.mark.parametrize(
    ("algorithm", "shared_params"),
    [("lg-fedavg", 1290), ("fedper", 8320), ("fedrep", 8320), ("fedbn", 9610), ("ditto", 9610), ("apfl", 9610)],
)
def test_split_and_personal_baselines_run_end_to_end(superlink, tmp_path, algorithm: str, shared_params: int) -> None:
    outcome = _run(superlink, tmp_path, algorithm, f"algorithm='{algorithm}'", rounds=2)
    _outcome_ok(outcome)
    rounds = _rounds(tmp_path / algorithm)
    assert [r["round"] for r in rounds] == [1, 2]
    last = rounds[-1]
    assert last["train"]["used"] == last["train"]["sent"] == 3 and len(last["eval"]["per_client"]) == NUM_NODES
    assert last["eval"]["mean"]["acc-shift-0"] > 0.2
    # only the shared part travels (MLP parameters: body 8,320, head 1,290; FedBN's mlp-bn shares 9,610 of 10,122)
    assert 3 * shared_params * 4 < last["bytes"]["train_up"] < 3 * (shared_params * 4 + 4000)
    if algorithm in ("ditto", "apfl"):
        assert "global-acc-shift-0" in last["eval"]["mean"]


def test_dapperfl_on_the_digit_domains_prunes_by_device(superlink, tmp_path, data_dir) -> None:
    config = (
        f"results-dir='{tmp_path}' run-name='dapperfl' num-rounds=2 fraction-train=1.0 local-epochs=2 "
        f"algorithm='dapperfl' dataset='digit-domains' partition='domains' data-dir='{data_dir}' "
        "domain-share=0.005 domain-test-size=200 shift-degrees='0' batch-size=32"
    )
    outcome = superlink.run(REPO, config, num_supernodes=10)
    _outcome_ok(outcome)
    rounds = _rounds(tmp_path / "dapperfl")
    by_ratio = rounds[-1]["by_ratio"]
    assert list(by_ratio) == ["0", "0.2", "0.4", "0.6", "0.8"]
    assert all(len(entry["clients"]) == 2 for entry in by_ratio.values())
    values = [entry["values"] for entry in by_ratio.values()]
    assert values == sorted(values, reverse=True) and values[-1] < 0.5 * values[0]
    summary = json.loads((tmp_path / "dapperfl" / "summary.json").read_text())
    up = [summary["by_ratio"][r]["mb_up"] for r in ("0", "0.2", "0.4", "0.6", "0.8")]
    assert up == sorted(up, reverse=True) and up[-1] < 0.5 * up[0]
    assert {f"domain-{d}-acc" for d in ("mnist", "usps", "mnist-m", "syn")} <= set(summary["final"]["mean"])
    text = (tmp_path / "dapperfl" / "summary.md").read_text()
    assert "global accuracy |" in text and "| 0.8 | 2 |" in text
