"""Server memory at scale: FedAMP's client models live in a memory-mapped store in the run folder, so a round's
server work allocates for the round's clients, not for all of them; large evaluations and pre-training go out in
chunks of `messages-in-flight`."""

from __future__ import annotations

import logging
import shutil
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from flwr.app import MessageType

from common.config import parse_run_config
from common.methods.attention import ModelMatrix, cloud_models
from common.wire.messages import ARRAYS
from server_app.exchange import each_reply, exchange
from server_app.replies import TrainReply

from .fakes import FakeReply, PushPullGrid, hand_made_runner, train_content

CLIENTS, VALUES = 200, 400_000  # a small model, many clients: the store is 320 MB
SPECS = [("w", (VALUES,))]


@pytest.fixture(autouse=True)
def _room_for_stores(tmp_path: Path) -> Iterator[None]:
    """Skip where the temporary folder cannot hold three stores; delete each test's files after it (pytest keeps
    the folders of its last runs: a GB of stores each)."""
    needed = 3 * 4 * CLIENTS * VALUES + (256 << 20)
    free = shutil.disk_usage(tmp_path).free
    if free < needed:
        pytest.skip(f"needs {needed / 1e9:.1f} GB free in {tmp_path.parent}, has {free / 1e9:.1f} GB")
    yield
    for item in tmp_path.iterdir():
        shutil.rmtree(item) if item.is_dir() else item.unlink()


def _round_peak(workdir: Path | None) -> tuple[int, object]:
    """Peak bytes numpy allocates for FedAMP's server over one round of 10% of the clients (uploads stored, the
    next round's cloud models built), with the store in `workdir` or in memory."""
    cfg = parse_run_config({"algorithm": "fedamp", "fraction-train": 0.1, "pretrain-epochs": 0})
    runner = hand_made_runner(cfg, SPECS, [np.zeros(VALUES, np.float32)], dict.fromkeys(range(CLIENTS), 50))
    strategy = runner.strategy
    strategy.workdir = workdir
    rng = np.random.default_rng(0)
    tracemalloc.start()
    try:
        matrix = strategy.ensure_matrix()
        sampled = strategy.sample(1)
        replies = []
        for pid in sampled:
            content = train_content(["w"], [rng.normal(size=VALUES).astype(np.float32)], 50)
            reply = TrainReply(pid, 50, 0.5, content)
            strategy.decode_train_reply(1, reply)
            replies.append(reply)
        strategy.aggregate(1, replies)
        runner.message_contents(2, strategy.sample(2), MessageType.TRAIN)
        return tracemalloc.get_traced_memory()[1], matrix
    finally:
        tracemalloc.stop()


def test_fedamp_server_memory_is_bounded_by_the_store_not_the_clients(tmp_path: Path) -> None:
    store_bytes = 4 * CLIENTS * VALUES
    peak, matrix = _round_peak(tmp_path)
    assert isinstance(matrix.W, np.memmap) and Path(matrix.W.filename).parent == tmp_path  # type: ignore[attr-defined]
    # the uploads (20 x 1.6 MB, twice: records and arrays), 20 cloud models and a Gram column block per thread (32 MB)
    assert peak < 0.75 * store_bytes, f"{peak / 1e6:.0f} MB allocated for a {store_bytes / 1e6:.0f} MB store"
    in_memory_peak, _ = _round_peak(None)
    assert in_memory_peak > store_bytes  # without the store the rows themselves are allocated: the check can fail


def test_the_store_is_deleted_when_the_run_closes(tmp_path: Path) -> None:
    cfg = parse_run_config({"algorithm": "fedamp"})
    runner = hand_made_runner(cfg, [("w", (10,))], [np.zeros(10, np.float32)], dict.fromkeys(range(4), 5))
    runner.strategy.workdir = tmp_path
    runner.strategy.ensure_matrix()
    assert (tmp_path / "client-models.npy").is_file()
    runner.strategy.close()
    assert not (tmp_path / "client-models.npy").exists()


class _Sender:
    def __init__(self) -> None:
        self.built: list[list[int]] = []

    def messages(self, partition_ids):
        self.built.append(list(partition_ids))
        return list(partition_ids)


@pytest.mark.parametrize(("clients", "in_flight", "per_pull"), [(1000, 256, 7), (5, 64, 0), (6, 2, 1)])
def test_large_sends_keep_a_window_of_messages_in_flight(clients: int, in_flight: int, per_pull: int) -> None:
    sender = _Sender()
    grid = PushPullGrid(lambda pids: [FakeReply(pid) for pid in pids], per_pull)
    answered = [
        reply.metadata.src_node_id
        for reply in each_reply(exchange(grid, list(range(clients)), sender.messages, in_flight, 60.0))
    ]
    assert answered == list(range(clients)) and sum(sender.built, []) == list(range(clients)), "each once, in order"
    assert grid.most_outstanding == min(in_flight, clients), "never more than messages-in-flight out at once"
    assert per_pull == 0 or len(sender.built) > clients // in_flight, "freed slots refilled before the window drains"


def test_a_message_slow_to_build_still_has_the_whole_timeout_for_its_reply(caplog) -> None:
    """The timeout runs from when a message is sent, not from when its batch began to be built (FedAMP's first
    cloud models at 10,000 clients took longer than round-timeout: every reply of the round was given up); a
    message left unanswered is given up with a warning."""
    import time

    def slow(pids):
        time.sleep(0.3)
        return list(pids)

    grid = PushPullGrid(lambda pids: [FakeReply(pid) for pid in pids])
    answered = [r.metadata.src_node_id for r in each_reply(exchange(grid, [1, 2, 3], slow, 3, 0.2))]
    assert answered == [1, 2, 3]

    class Silent(PushPullGrid):  # node 2 never answers
        def pull_messages(self, message_ids):
            return [r for r in super().pull_messages(message_ids) if r.metadata.src_node_id != 2]

    silent = Silent(lambda pids: [FakeReply(pid) for pid in pids])
    with caplog.at_level(logging.WARNING, logger="flwr"):
        got = [r.metadata.src_node_id for r in each_reply(exchange(silent, [1, 2, 3], list, 3, 0.2))]
    assert got == [1, 3]
    assert "1 message(s) unanswered 0.2 s after they were sent (round-timeout): given up" in caplog.text

    class Forgetting(Silent):  # a grid that keeps replies until told (the in-process engine) hears what was given up
        forgotten: list[str] = []

        def forget_messages(self, message_ids):
            self.forgotten.extend(message_ids)

    forgetting = Forgetting(lambda pids: [FakeReply(pid) for pid in pids])
    assert [r.metadata.src_node_id for r in each_reply(exchange(forgetting, [1, 2, 3], list, 3, 0.2))] == [1, 3]
    assert len(forgetting.forgotten) == 1


class _OneWorker(PushPullGrid):
    """One worker answering its queue in order, each message STEP_S after the worker took it up."""

    STEP_S = 0.2

    def __init__(self) -> None:
        super().__init__(lambda pids: [FakeReply(pid) for pid in pids], per_pull=1)
        self.head_since: float | None = None  # when the worker took the message at the head of the queue up

    def pull_messages(self, message_ids):
        import time

        now = time.monotonic()
        if self.head_since is None:
            self.head_since = now
        if now < self.head_since + self.STEP_S:
            return []
        self.head_since = now
        return super().pull_messages(message_ids)


class _SaysWhenStarted(_OneWorker):
    def message_started(self, message_id: str) -> bool:
        return not self.waiting or self.waiting[0][0] == message_id or message_id not in dict(self.waiting)


def test_a_message_queued_for_a_busy_worker_is_not_late(caplog) -> None:
    """Four messages for one worker that takes 0.2 s each, round-timeout 0.6 s: timed from the push, the fourth is
    given up (it is answered 0.8 s after); timed from when the worker takes each up (the in-process engine's
    `message_started`), every reply is used, however long the queue waited."""
    with caplog.at_level(logging.WARNING, logger="flwr"):
        from_push = [r.metadata.src_node_id for r in each_reply(exchange(_OneWorker(), [1, 2, 3, 4], list, 4, 0.6))]
    assert 4 not in from_push and "unanswered 0.6 s after they were sent" in caplog.text
    from_start = [r.metadata.src_node_id for r in each_reply(exchange(_SaysWhenStarted(), [1, 2, 3, 4], list, 4, 0.6))]
    assert from_start == [1, 2, 3, 4]


def test_pretraining_hands_the_strategy_a_window_of_replies_at_a_time() -> None:
    """Replies come one per pull; FedAMP's step touches every Gram row, so it runs once per window, not per reply."""
    from server_app.warmup import pretrain_round

    def accept(replies):  # node 9's reply fails
        kept = sorted((r for r in replies if r.metadata.src_node_id != 9), key=lambda r: r.metadata.src_node_id)
        return kept, len(replies) - len(kept), 0

    folds: list[list] = []
    grid = PushPullGrid(lambda pids: [FakeReply(pid) for pid in pids], per_pull=1)
    stats = pretrain_round(exchange(grid, list(range(10)), _Sender().messages, 4, 60.0), 4, accept, folds.append)
    assert [len(f) for f in folds] == [4, 4, 1]  # once per window of 4 replies, then the rest
    assert sorted(r.metadata.src_node_id for r in sum(folds, [])) == list(range(9))
    assert stats == {"used": 9, "failed": 1, "rejected": 0, "flops": 0.0}


def _peak_rss_kib() -> int:
    return int(
        next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM")).split()[1]
    )


def _reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def test_store_results_equal_the_in_memory_ones(tmp_path: Path) -> None:
    """Gram rows and cloud models read from the file (column blocks by pread) are those of the same rows in memory;
    several column blocks are crossed (7 rows x 30,000 values, blocks of 1024+ columns)."""
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(7, 30_000)).astype(np.float32)
    stored = ModelMatrix(7, np.zeros(30_000, np.float32), True, tmp_path / "store.npy")
    in_memory = ModelMatrix(7, np.zeros(30_000, np.float32), True)
    for matrix in (stored, in_memory):
        matrix.set_rows(list(range(7)), rows)
    assert isinstance(stored.W, np.memmap)
    np.testing.assert_allclose(stored.G, in_memory.G, rtol=1e-12)
    np.testing.assert_allclose(stored.G, rows.astype(np.float64) @ rows.astype(np.float64).T, rtol=1e-12)
    xi = rng.random((7, 7))
    np.testing.assert_allclose(
        cloud_models(xi, stored.W, [5, 2]), cloud_models(xi, in_memory.W, [5, 2]), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(
        cloud_models(xi, stored.W, [5, 2]), (xi[[5, 2]] @ rows.astype(np.float64)), rtol=1e-4, atol=1e-4
    )


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_a_round_on_the_store_keeps_it_out_of_resident_memory(tmp_path: Path) -> None:
    """A round on a 320 MB store (20 uploads written, the Gram update, 20 cloud models) peaks well under the store:
    its pages are released and column blocks are read by pread. Reading it through the mapping, the same measure
    sees the whole store resident, so the check can fail."""
    store_kib = 4 * CLIENTS * VALUES // 1024
    matrix = ModelMatrix(CLIENTS, np.zeros(VALUES, np.float32), True, tmp_path / "store.npy")
    rng = np.random.default_rng(0)
    uploads = [[rng.normal(size=VALUES).astype(np.float32)] for _ in range(20)]
    try:
        _reset_peak_rss()
    except OSError:
        pytest.skip("/proc/self/clear_refs is not writable here")
    before = _peak_rss_kib()
    matrix.set_rows_from_arrays(list(range(0, CLIENTS, 10)), uploads)
    cloud = cloud_models(np.full((CLIENTS, CLIENTS), 1.0 / CLIENTS), matrix.W, list(range(20)))
    assert _peak_rss_kib() - before < 0.6 * store_kib
    del cloud
    _reset_peak_rss()
    before = _peak_rss_kib()
    float(np.asarray(matrix.W).sum(dtype=np.float64))  # through the mapping
    assert _peak_rss_kib() - before > 0.9 * store_kib


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_checkpoint_and_resume_of_the_store_stay_out_of_resident_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writing a checkpoint with a 320 MB store, and restoring it into a new store in the run folder, each peak far
    under the store (row blocks of 32 MB here); the restored rows and Gram matrix are the saved ones."""
    from common.storage import pages
    from common.storage.persist import load_tree, save_tree

    monkeypatch.setattr(pages, "_RESIDENT_BYTES", 32 << 20)
    store_kib = 4 * CLIENTS * VALUES // 1024
    matrix = ModelMatrix(CLIENTS, np.full(VALUES, 0.5, np.float32), True, tmp_path / "store.npy")
    matrix.set_rows([3, 7], np.stack([np.full(VALUES, 1.0, np.float32), np.full(VALUES, 2.0, np.float32)]))
    assert matrix.G[3, 7] == 2.0 * VALUES  # the Gram rows of the rows written, brought up to date before measuring
    try:
        _reset_peak_rss()
    except OSError:
        pytest.skip("/proc/self/clear_refs is not writable here")
    before = _peak_rss_kib()
    save_tree(tmp_path / "checkpoint.npz", {"W": matrix.W, "G": matrix.G, "heard": matrix.heard})
    assert _peak_rss_kib() - before < 0.3 * store_kib
    _reset_peak_rss()
    before = _peak_rss_kib()
    saved = load_tree(tmp_path / "checkpoint.npz", map_from_bytes=64 << 20)
    restored = ModelMatrix.from_state(saved["W"], saved["G"], saved["heard"], True, tmp_path / "restored.npy")
    assert _peak_rss_kib() - before < 0.3 * store_kib
    assert isinstance(restored.W, np.memmap) and Path(restored.W.filename).name == "restored.npy"  # type: ignore[attr-defined]
    assert float(restored.W[7, -1]) == 2.0 and float(restored.W[0, 0]) == 0.5
    np.testing.assert_array_equal(restored.G, matrix.G)
    assert restored.heard.tolist() == matrix.heard.tolist()


def test_an_evaluation_in_many_batches_builds_its_shared_payload_once() -> None:
    cfg = parse_run_config({"algorithm": "fedavg"})
    runner = hand_made_runner(cfg, [("w", (10,))], [np.zeros(10, np.float32)], dict.fromkeys(range(6), 5))
    built: list[int] = []
    payload = runner.strategy.shared_payload

    def counted(server_round: int) -> dict:
        built.append(server_round)
        return payload(server_round)

    runner.strategy.shared_payload = counted  # type: ignore[method-assign]
    batches = [runner.message_contents(1, pids, MessageType.EVALUATE) for pids in ([0, 1], [2], [3, 4, 5])]
    assert built == [1], "one global model serialized for the whole evaluation, not one per batch of the window"
    models = {id(content.array_records[ARRAYS]) for batch in batches for content in batch}
    assert len(models) == 1, "every message carries the same record (one shared-memory block on the engine)"
    runner.message_contents(1, [0], MessageType.TRAIN)
    runner.message_contents(2, [0], MessageType.EVALUATE)
    assert built == [1, 1, 2], "another kind of message or round builds its own"
