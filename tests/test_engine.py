"""The in-process engine: what crosses between its processes is rebuilt identical (shared memory freed), its grid
answers like a SuperLink (unknown nodes, dead workers), a run killed midway resumes to the uninterrupted run's
messages, and every algorithm sends and receives exactly the same messages on it as on Flower's simulation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from common.algorithms import SPECS
from common.storage.persist import StateFileError
from experiments.benchmarks.measure import message_digests
from experiments.engine.blobs import SHARED_FROM_BYTES, SharedArrays
from experiments.engine.grid import FIRST_NODE_ID, InProcessGrid
from experiments.engine.serve import serve
from experiments.engine.transport import blob_refs, records_in, records_out
from experiments.run.presets import run_config_text
from experiments.run.superlink import stop_process_tree
from server_app.checkpoint import load_checkpoint

from .conftest import REPO
from .harness.ray_head import RayHead


def _content() -> RecordDict:
    rng = np.random.default_rng(0)
    return RecordDict(
        {
            "arrays": ArrayRecord(
                {
                    "big": Array(rng.standard_normal(SHARED_FROM_BYTES // 2).astype(np.float32)),
                    "small": Array(np.arange(6, dtype=np.int64).reshape(2, 3)),
                    "empty": Array(np.zeros(0, np.float32)),
                }
            ),
            "metrics": MetricRecord({"loss": 0.25, "n": 7, "curve": [0.5, 0.75]}),
            "config": ConfigRecord({"phase": 2, "flag": True, "name": "x", "raw": b"\x00\x01"}),
        }
    )


def _gone(name: str) -> bool:
    from multiprocessing import shared_memory

    try:
        shared_memory.SharedMemory(name=name).close()
    except FileNotFoundError:
        return True
    return False


def test_contents_cross_identical_and_shared_blocks_are_kept_while_recent_then_freed() -> None:
    content = _content()
    shared = SharedArrays()
    first, second = records_out(content, shared.share), records_out(content, shared.share)
    refs = blob_refs(first)
    assert len(refs) == 1 and refs == blob_refs(second), "one block for the one large array, shared by both"
    for items in (first, second):
        assert records_in(items).object_id == content.object_id  # Flower's hash over everything: the same
    shared.release(refs)
    shared.release(refs)
    assert not _gone(refs[0].name), "idle, but one of the most recent: the window's next batch may send it again"
    assert blob_refs(records_out(content, shared.share)) == refs, "sent again: the same block, not a new one"
    shared.release(refs)
    others = [_content() for _ in range(SharedArrays.KEPT_IDLE)]  # newer payloads, each answered at once
    for other in others:
        shared.release(blob_refs(records_out(other, shared.share)))
    assert _gone(refs[0].name), "the oldest idle block is freed once KEPT_IDLE newer ones are idle"
    kept = [blob_refs(records_out(other, shared.share))[0] for other in others]
    shared.close()
    assert all(_gone(ref.name) for ref in kept)


def test_a_reply_block_is_freed_by_its_reader() -> None:
    from experiments.engine.blobs import put

    items = records_out(_content(), put)
    (ref,) = blob_refs(items)
    assert records_in(items, unlink=True).object_id == _content().object_id
    assert _gone(ref.name)


def _query(node: int) -> Message:
    for name in ("run_id", "node_id", "task_id"):
        setattr(TaskIdentity, name, 1)
    return Message(
        RecordDict({"config": ConfigRecord({"server-round": 0})}), dst_node_id=node, message_type=MessageType.QUERY
    )


def _replies(grid: InProcessGrid, ids: list[str], timeout: float = 120.0) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < len(ids) and time.monotonic() < deadline:
        got.extend(grid.pull_messages([i for i in ids if i not in {r.metadata.reply_to_message_id for r in got}]))
    return got


def test_the_grid_answers_queries_and_a_message_to_an_unknown_node_gets_an_error_reply(tmp_path: Path) -> None:
    grid = InProcessGrid({"dataset": "digits", "results-dir": str(tmp_path)}, 3, workers=0)  # in this process
    try:
        assert sorted(grid.get_node_ids()) == [FIRST_NODE_ID, FIRST_NODE_ID + 1, FIRST_NODE_ID + 2]
        ids = list(grid.push_messages([_query(FIRST_NODE_ID + 1), _query(7)]))
        replies = {r.metadata.reply_to_message_id: r for r in _replies(grid, ids)}
        answer, unknown = replies[ids[0]], replies[ids[1]]
        assert answer.content.metric_records["metrics"]["partition-id"] == 1
        assert answer.metadata.src_node_id == FIRST_NODE_ID + 1
        assert unknown.has_error() and "node 7 is not a node of this run" in unknown.error.reason
    finally:
        grid.close()


def test_replies_the_server_gave_up_are_not_kept(tmp_path: Path) -> None:
    """A message given up at the round timeout (server_app/exchange.py tells the grid) leaves no reply behind, whether
    it was answered before or after: late replies do not pile up over a long run; the node's state is kept."""
    grid = InProcessGrid({"dataset": "digits", "results-dir": str(tmp_path)}, 2, workers=0)  # answered at the push
    try:
        late, answered_first = list(grid.push_messages([_query(FIRST_NODE_ID), _query(FIRST_NODE_ID + 1)]))
        grid.forget_messages([late])
        assert grid.pull_messages([]) == [] and late not in grid._pending and late not in grid._ready
        (kept,) = grid.push_messages([_query(FIRST_NODE_ID + 1)])  # collects the earlier one: a reply not yet read
        assert answered_first in grid._ready
        grid.forget_messages([answered_first])
        assert answered_first not in grid._ready
        assert [r.metadata.reply_to_message_id for r in _replies(grid, [kept])] == [kept]
        assert not grid._pending and not grid._ready and not grid._forgotten
    finally:
        grid.close()


def test_a_message_waiting_for_a_busy_worker_has_not_started(tmp_path: Path) -> None:
    """The round timeout runs from when a worker takes a message up (server_app/exchange.py): messages queued
    behind a busy worker say they have not started; answered ones say they have."""
    grid = InProcessGrid({"dataset": "digits", "results-dir": str(tmp_path)}, 5, workers=1)
    try:
        assert not _replies(grid, list(grid.push_messages([_query(FIRST_NODE_ID)])))[0].has_error()
        (pid,) = list(grid._pool._processes)  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGSTOP)  # busy: nothing it holds is answered
        try:
            ids = list(grid.push_messages([_query(FIRST_NODE_ID + node) for node in range(1, 5)]))
            time.sleep(0.5)  # the pool hands the worker what its call queue holds (two items for one worker)
            assert grid.message_started(ids[0]) and not grid.message_started(ids[-1])
        finally:
            os.kill(pid, signal.SIGCONT)
        assert len(_replies(grid, ids)) == 4 and all(grid.message_started(i) for i in ids)
    finally:
        grid.close()


def test_a_worker_that_dies_gives_error_replies_and_the_pool_is_replaced(tmp_path: Path) -> None:
    grid = InProcessGrid({"dataset": "digits", "results-dir": str(tmp_path)}, 2, workers=1)
    try:
        assert not _replies(grid, list(grid.push_messages([_query(FIRST_NODE_ID)])))[0].has_error()
        (pid,) = list(grid._pool._processes)  # type: ignore[attr-defined]
        os.kill(pid, signal.SIGSTOP)  # frozen: the next message waits in the pool, unanswered
        ids = list(grid.push_messages([_query(FIRST_NODE_ID + 1)]))
        os.kill(pid, signal.SIGKILL)  # then killed with it in flight (e.g. by the kernel's out-of-memory killer)
        lost = _replies(grid, ids)
        assert lost[0].has_error() and "worker process failed" in lost[0].error.reason
        assert grid.restarts == 1
        again = _replies(grid, list(grid.push_messages([_query(FIRST_NODE_ID + 1)])))
        assert not again[0].has_error(), "a new pool serves the next message"
    finally:
        grid.close()


# ----- whole runs ----------------------------------------------------------------------------------------------
BASE = {
    "dataset": "digits",
    "num-rounds": 3,
    "iterations": 1,
    "fraction-train": 1.0,  # 4 training clients a round (one held out): 1 dropped, 1 late, 2 replies aggregated
    "local-epochs": 1,
    "lr": 0.1,
    "readjust-ratio": 0.2,
    "seed": 3,
    "shift-degrees": "0,1",
    "message-digests": True,
    "drop-rate": 0.3,
    "straggler-rate": 0.3,
    "holdout-clients": 0.25,
    "holdout-finetune-epochs": 1,
    "eval-every": 1,
}
CLIENTS = 5


_digests = message_digests


@pytest.fixture(scope="module")
def superlink(tmp_path_factory):
    """One SuperLink whose simulations all join one Ray head: each of the 27 runs skips Ray's start-up."""
    folder = tmp_path_factory.mktemp("flwr-home")
    with RayHead(folder / "ray-head.log") as head, head.superlink(folder) as link:
        yield link


def _both_engines(superlink, config: dict, tmp_path: Path) -> tuple[list[str], list[str]]:
    """The message digests of one config run through Flower's simulation and on the in-process engine."""
    config = {**config, "run-name": "run"}
    # one Ray actor runs the five clients in turn: the start-up of a second (Python, torch, the app) is most of a
    # short run's cost, and the replies are the same (faults are chosen by seed and round, not by timing)
    outcome = superlink.run(
        REPO,
        run_config_text({**config, "results-dir": str(tmp_path / "sim")}),
        num_supernodes=CLIENTS,
        cpus_per_client=2,
    )
    assert outcome.status == "finished:completed", outcome.output[-3000:]
    # the ClientApp inline: the same grid, transport and apps without a worker pool's start-up per algorithm (the
    # pool is tested by the resume test below and the worker tests above)
    assert serve({**config, "results-dir": str(tmp_path / "inp")}, CLIENTS, inline=True)
    return _digests(tmp_path / "sim" / "run"), _digests(tmp_path / "inp" / "run")


@pytest.mark.e2e
@pytest.mark.parametrize("algorithm", sorted(SPECS))
def test_every_algorithm_sends_the_same_messages_on_both_engines(algorithm: str, superlink, tmp_path: Path) -> None:
    simulated, in_process = _both_engines(superlink, {**BASE, "algorithm": algorithm}, tmp_path)
    kinds = {line.split()[1] for line in simulated}
    assert {"train_down", "train_up", "eval_down", "eval_up"} <= kinds
    assert in_process == simulated
    used = [r["train"]["used"] for r in _records(tmp_path / "sim" / "run")]
    assert used == [r["train"]["used"] for r in _records(tmp_path / "inp" / "run")]
    assert min(used) >= 2, f"every round must aggregate replies (faults took them all: {used})"


@pytest.mark.e2e
def test_secure_aggregation_sends_the_same_messages_on_both_engines(superlink, tmp_path: Path) -> None:
    # SecAgg+'s four stages per round through Flower's simulation and the in-process engine (SCAFFOLD: its change of
    # c_i travels in the masked vector beside the model); its keys, shares and masks are random, not in the digests
    config = {**BASE, "algorithm": "scaffold", "secagg": "secaggplus", "drop-rate": 0.0, "straggler-rate": 0.0}
    simulated, in_process = _both_engines(superlink, config, tmp_path)
    assert in_process == simulated
    records = _records(tmp_path / "sim" / "run")
    assert [r["train"]["secagg"]["survivors"] for r in records] == [4, 4, 4]
    assert len([line for line in simulated if line.split()[1] == "train_up"]) == 3 * 4 * 4  # 4 stages, 4 clients


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _checkpointed_round(run_dir: Path) -> int:
    try:
        return load_checkpoint(run_dir).round
    except StateFileError:
        return 0


def test_a_killed_run_resumes_on_the_in_process_engine_to_the_uninterrupted_messages(tmp_path: Path) -> None:
    from experiments.run.launchers import InProcessEngine

    config = {**BASE, "algorithm": "dmpfl", "num-rounds": 6, "drop-rate": 0.0, "straggler-rate": 0.0, "run-name": "run"}
    assert serve({**config, "results-dir": str(tmp_path / "a")}, CLIENTS, workers=2)
    reference = _digests(tmp_path / "a" / "run")
    records = [json.loads(line) for line in (tmp_path / "a" / "run" / "metrics.jsonl").read_text().splitlines()]
    timed = [r["round"] for r in records if r.get("evaluate_s", -1.0) > 0]
    assert timed == [r["round"] for r in records if r["eval"] is not None] and timed, "each evaluation is timed"

    run_dir = tmp_path / "b" / "run"
    command = [
        sys.executable,
        "-m",
        "experiments.engine",
        "--run-config",
        json.dumps({**config, "results-dir": str(tmp_path / "b")}),
        "--clients",
        str(CLIENTS),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and _checkpointed_round(run_dir) < 3 and process.poll() is None:
            time.sleep(0.05)
    finally:
        stop_process_tree(process, graceful=False)  # killed: the server and its workers at once
    stopped_after = load_checkpoint(run_dir).round
    assert 3 <= stopped_after < 6, f"the kill came too late to test anything (round {stopped_after})"

    lines: list[str] = []
    outcome = InProcessEngine(workers=2).run(
        {**config, "results-dir": str(tmp_path / "b"), "resume": str(run_dir)}, CLIENTS, 600, lines.append
    )
    assert outcome.status == "finished:completed", "\n".join(lines[-30:])
    assert any(f"resumed after round {stopped_after} of 6" in line for line in lines)
    assert _digests(run_dir) == reference, "the resumed run sends and receives what the uninterrupted one did"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_after_rounds"] == [stopped_after] and summary["rounds_completed"] == 6
