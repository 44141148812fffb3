"""End to end through `flwr run` on a private local SuperLink: results files, accuracy, determinism, errors.
Each algorithm's own behaviour over whole runs: tests/test_algorithm_runs.py, on the in-process engine."""

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
