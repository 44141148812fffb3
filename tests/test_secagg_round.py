"""A training round under run-config `secagg` = secaggplus through the round runner: hand-made clients run the
client half (client_app/secure.py) in-process; the server's aggregate is the plain weighted mean within
quantization error, the server never receives a client's arrays, dropouts and forged vectors are left out, and the
run's config refuses what secure aggregation cannot serve."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, Message, MessageType, MetricRecord, RecordDict

from client_app import secure
from common.config import ConfigError, parse_run_config
from common.learning.models import ModelLayout
from common.secagg.params import SecAggParams
from common.secagg.protocol import SecAggRefused
from common.secagg.wire import SETUP, SHARE, UNMASK, cohort_record, read_cohort, vector_arrays
from common.wire.codec import encode_model
from common.wire.messages import ARRAYS, CONTROL, FEATURE_MEAN, SECAGG
from common.wire.records import to_plain_record, to_record
from server_app.clients import ClientInfo, ClientRegistry
from server_app.runner import RoundRunner
from server_app.strategies import strategy_class

from .fakes import FakeReply, PushPullGrid, hand_made_runner, train_content

SPECS = [("w", (3, 4)), ("b", (4,))]
SIZES = {0: 120, 1: 40, 2: 300, 3: 75, 4: 10}


class SecureClients(PushPullGrid):
    """Each message answered by its client's half: the SecAgg+ stages, and a training reply of the client's fixed
    arrays, sample count and loss turned into its masked vector. `fail` makes a client fail a stage; `forge`
    replaces a client's masked vector."""

    def __init__(self, cfg, fail: dict[int, str] | None = None, forge: set[int] = frozenset(), upload=None) -> None:
        super().__init__(self.answer_all)
        self.cfg, self.fail, self.forge = cfg, fail or {}, forge
        self.upload = upload or self.plain_upload
        rng = np.random.default_rng(3)
        self.arrays = {pid: [rng.normal(size=s).astype(np.float32) for _, s in SPECS] for pid in SIZES}
        self.losses = {pid: float(rng.uniform(0.5, 2.0)) for pid in SIZES}
        self.contexts = {
            pid: Context(1, 100 + pid, {"partition-id": pid, "num-partitions": len(SIZES)}, RecordDict(), {})
            for pid in SIZES
        }
        self.received: list[RecordDict] = []

    def answer_all(self, messages: list[Message]) -> list[Message]:
        replies = []
        for msg in messages:
            pid, kind = msg.metadata.dst_node_id - 100, msg.metadata.message_type
            context = self.contexts[pid]
            if self.fail.get(pid) == kind:
                replies.append(FakeReply(100 + pid, error="gone"))
                continue
            if kind == SETUP:
                content = secure.setup(self.cfg, msg, context, pid)
            elif kind == SHARE:
                content = secure.share(self.cfg, msg, context)
            elif kind == UNMASK:
                content = secure.unmask(self.cfg, msg, context)
            else:
                assert kind == MessageType.TRAIN
                plain = self.upload(pid)
                plain.metric_records["metrics"]["server-round"] = msg.content.config_records["config"]["server-round"]
                content = secure.masked_reply(self.cfg, msg, context, plain)
                if pid in self.forge:  # a vector of another length: the sum could not be unmasked with it
                    content[SECAGG] = to_plain_record(
                        vector_arrays(np.zeros(7, np.uint64), self.cfg.secagg_params.modulus_range)
                    )
            self.received.append(content)
            replies.append(FakeReply(100 + pid, content))
        return replies

    def plain_upload(self, pid: int) -> RecordDict:
        return train_content([n for n, _ in SPECS], self.arrays[pid], SIZES[pid], self.losses[pid])

    def mean(self, pids: list[int]) -> list[np.ndarray]:
        total = sum(SIZES[p] for p in pids)
        return [sum(SIZES[p] * self.arrays[p][i] for p in pids) / total for i in range(len(SPECS))]


def _runner(**overrides):
    raw = {"algorithm": "fedavg", "secagg": "secaggplus", "fraction-train": 1.0, **overrides}
    cfg = parse_run_config(raw)
    initial = [np.zeros(s, np.float32) for _, s in SPECS]
    return hand_made_runner(cfg, SPECS, initial, SIZES), cfg


def test_the_round_aggregates_the_weighted_mean_without_seeing_an_upload(server_identity: None) -> None:
    runner, cfg = _runner()
    grid = SecureClients(cfg)
    runner.train(grid, 1)
    for got, want in zip(runner.strategy.global_arrays, grid.mean(list(SIZES)), strict=True):
        assert np.max(np.abs(got - want)) < 1e-3
    train = runner.round_log.train
    assert train["num_examples"] == sum(SIZES.values()) and train["used"] == 5
    weighted_loss = sum(SIZES[p] * grid.losses[p] for p in SIZES) / sum(SIZES.values())
    assert train["loss"] == pytest.approx(weighted_loss, abs=1e-4)
    assert train["secagg"]["survivors"] == 5 and train["secagg"]["threshold"] == 4
    assert list(train["secagg"]) == [
        "cohort",
        "shares",
        "threshold",
        "survivors",
        "dropped_after_sharing",
        "capped",
        "seconds",
    ]
    assert train["secagg"]["capped"] == 0 and train["clients"] == sorted(SIZES)
    assert all(ARRAYS not in content for content in grid.received)  # no plain upload ever reached the server
    counts = [c.metric_records["metrics"]["num-examples"] for c in grid.received if "num-examples" in c["metrics"]]
    assert counts and set(counts) == {1}  # the withheld value, never a client's count
    assert runner.round_log.bytes["train_up"] > 0 and runner.round_log.bytes["train_down"] > 0


def test_a_client_that_drops_after_sharing_leaves_the_others_mean(server_identity: None) -> None:
    runner, cfg = _runner()
    grid = SecureClients(cfg, fail={2: MessageType.TRAIN})
    runner.train(grid, 1)
    for got, want in zip(runner.strategy.global_arrays, grid.mean([0, 1, 3, 4]), strict=True):
        assert np.max(np.abs(got - want)) < 1e-3
    assert runner.round_log.train["secagg"]["dropped_after_sharing"] == 1
    assert runner.round_log.train["num_examples"] == sum(SIZES.values()) - SIZES[2]


def test_a_forged_masked_vector_is_left_out(server_identity: None) -> None:
    runner, cfg = _runner()
    grid = SecureClients(cfg, forge={4})
    runner.train(grid, 1)
    for got, want in zip(runner.strategy.global_arrays, grid.mean([0, 1, 2, 3]), strict=True):
        assert np.max(np.abs(got - want)) < 1e-3
    assert runner.round_log.train["rejected"] == 1


def test_too_many_dropouts_keep_the_model(server_identity: None) -> None:
    runner, cfg = _runner()
    grid = SecureClients(cfg, fail={0: SHARE, 1: SHARE})
    runner.train(grid, 1)
    assert all(not a.any() for a in runner.strategy.global_arrays)
    assert "threshold 4" in runner.round_log.train["secagg"]["aborted"]
    assert runner.round_log.train["used"] == 0


def test_a_client_refuses_a_cohort_the_runs_parameters_do_not_give() -> None:
    params = SecAggParams(num_shares=5, reconstruction_threshold=3)
    cohort = params.for_cohort(9)
    record = cohort_record(cohort)
    assert read_cohort({SECAGG: record}, params) == cohort
    record["threshold"] = 2  # a server lowering the threshold to gather both secrets of one client
    with pytest.raises(SecAggRefused, match="threshold 2"):
        read_cohort({SECAGG: record}, params)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"algorithm": "fedamp"}, "each client's own model"),
        ({"algorithm": "local"}, "nothing to aggregate"),
        ({"dp": "central", "dp-noise-multiplier": 1.0}, "clip or noise one"),
        ({"robust-aggregation": "median"}, "clip, trim or rank"),
        ({"max-weight-ratio": 4.0}, "counts travel inside"),
        ({"secagg-reconstruction-threshold": 0.4}, "more than half"),
        ({"secagg-modulus-range": 3000}, "power of two"),
    ],
)
def test_the_run_config_refuses_what_secure_aggregation_cannot_serve(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_run_config({"secagg": "secaggplus", **overrides})


@pytest.fixture
def server_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages are built as a ServerApp builds them (Flower stamps them with the run of the process)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value, raising=False)


def _sparse_runner(secagg: bool):
    """FedDST on the hand-made layout with `w` prunable, with or without secure aggregation."""
    raw = {"algorithm": "feddst", "fraction-train": 1.0, **({"secagg": "secaggplus"} if secagg else {})}
    cfg = parse_run_config(raw)
    clients = ClientRegistry()
    for pid, num_train in SIZES.items():
        clients.add(ClientInfo(pid, 100 + pid, num_train, 5))
    layout = ModelLayout([np.zeros(s, np.float32) for _, s in SPECS], list(SPECS), prunable=("w",))
    return RoundRunner(cfg, strategy_class("feddst")(cfg, layout, clients), clients), cfg


@pytest.mark.parametrize("mask_round", [True, False])
def test_masked_uploads_under_secagg_give_the_plain_aggregate_and_mask(server_identity: None, mask_round: bool) -> None:
    """FedDST's readjustment round (values on each client's own mask: Eq. 5's per-position weights and the mask
    vote travel summed) and its values-only round (values on m_g) give the plain run's w_g within quantization
    error, and the same m_g."""
    plain, _ = _sparse_runner(False)
    secure_runner, cfg = _sparse_runner(True)
    strategy = plain.strategy
    server_round = next(r for r in range(1, 50) if strategy.values_only_round(r) != mask_round)
    rng = np.random.default_rng(11)
    global_mask = strategy.global_masks["w"]
    keep = int(global_mask.sum())
    contents = {}
    for pid in SIZES:
        dense = {name: rng.normal(size=shape).astype(np.float32) for name, shape in SPECS}
        if mask_round:
            mask = np.zeros(global_mask.size, bool)
            mask[rng.choice(global_mask.size, keep, replace=False)] = True
            arrays = encode_model(dense, {"w": mask.reshape(global_mask.shape)})
        else:
            arrays = encode_model(dense, {"w": global_mask}, values_only=True)
        metrics = MetricRecord({"num-examples": SIZES[pid], "train-loss": 1.0})
        contents[pid] = RecordDict({ARRAYS: to_plain_record(arrays), "metrics": metrics})
    plain.aggregate_train(server_round, [FakeReply(100 + pid, c) for pid, c in contents.items()])
    grid = SecureClients(
        cfg,
        upload=lambda pid: RecordDict(
            {ARRAYS: contents[pid][ARRAYS], "metrics": MetricRecord(dict(contents[pid]["metrics"]))}
        ),
    )
    secure_runner.train(grid, server_round)
    for got, want in zip(secure_runner.strategy.global_arrays, plain.strategy.global_arrays, strict=True):
        assert np.max(np.abs(got - want)) < 1e-3
    assert np.array_equal(secure_runner.strategy.global_masks["w"], plain.strategy.global_masks["w"])
    if mask_round:
        assert not np.array_equal(plain.strategy.global_masks["w"], global_mask)  # the vote moved m_g


def test_scaffold_under_secagg_moves_x_and_c_as_the_plain_round_with_equal_weights(server_identity: None) -> None:
    """SCAFFOLD's model and each client's change of c_i travel in one masked vector, every client weighing the same
    (its 1/|S|, not the sample counts): x and c come out as the plain round's within quantization error, with |S|
    the clients in the sum (client 2 drops after sharing: c moves by 4/5 of the mean change)."""
    raw = {"algorithm": "scaffold", "fraction-train": 1.0, "scaffold-server-lr": 0.5}
    initial = [np.full(shape, 0.25, np.float32) for _, shape in SPECS]
    layout = ModelLayout(initial, list(SPECS), params=tuple(name for name, _ in SPECS))
    runners = {}
    for secure_mode in (False, True):
        cfg = parse_run_config({**raw, **({"secagg": "secaggplus"} if secure_mode else {})})
        clients = ClientRegistry()
        for pid, num_train in SIZES.items():
            clients.add(ClientInfo(pid, 100 + pid, num_train, 5))
        runners[secure_mode] = RoundRunner(cfg, strategy_class("scaffold")(cfg, layout, clients), clients), cfg
    rng = np.random.default_rng(5)
    names = [name for name, _ in SPECS]
    models = {pid: [rng.normal(size=shape).astype(np.float32) for _, shape in SPECS] for pid in SIZES}
    deltas = {pid: [rng.normal(size=shape).astype(np.float32) for _, shape in SPECS] for pid in SIZES}

    def upload(pid: int) -> RecordDict:
        content = train_content(names, models[pid], SIZES[pid], 1.0 + pid)
        content[CONTROL] = to_record(names, deltas[pid])
        return content

    answered = [0, 1, 3, 4]
    plain, _ = runners[False]
    plain.aggregate_train(1, [FakeReply(100 + pid, upload(pid)) for pid in answered])
    secure_runner, cfg = runners[True]
    grid = SecureClients(cfg, fail={2: MessageType.TRAIN}, upload=upload)
    secure_runner.train(grid, 1)
    for got, want in zip(
        [*secure_runner.strategy.global_arrays, *secure_runner.strategy.control],
        [*plain.strategy.global_arrays, *plain.strategy.control],
        strict=True,
    ):
        assert np.max(np.abs(got - want)) < 1e-3
    mean_delta = [sum(deltas[p][i] for p in answered) / 4 for i in range(len(SPECS))]
    for got, mean in zip(secure_runner.strategy.control, mean_delta, strict=True):
        assert np.max(np.abs(got - 0.8 * mean)) < 1e-3
    total = sum(SIZES[p] for p in answered)
    weighted = [sum(SIZES[p] * models[p][i] for p in answered) / total for i in range(len(SPECS))]
    by_samples = [0.25 + 0.5 * (w - 0.25) for w in weighted]
    assert max(np.max(np.abs(g - w)) for g, w in zip(secure_runner.strategy.global_arrays, by_samples)) > 0.05
    train = secure_runner.round_log.train
    assert train["used"] == 4 and train["num_examples"] == 0  # the counts are not in the sum
    assert train["loss"] == pytest.approx(np.mean([1.0 + p for p in answered]), abs=1e-4)
    assert all(ARRAYS not in content and CONTROL not in content for content in grid.received)


def test_feddbes_round_0_under_secagg_sums_the_mean_representations_of_every_client(server_identity: None) -> None:
    """FedDBE's pre-training round as one secure sum over every client: the global mean is the sample-weighted
    mean of the clients' mean representations (the plain round 0's), and none of them reaches the server."""
    specs = [("body.w", (4, 3)), ("head.weight", (2, 4)), ("head.bias", (2,))]
    cfg = parse_run_config({"algorithm": "feddbe", "secagg": "secaggplus", "fraction-train": 1.0})
    runner = hand_made_runner(cfg, specs, [np.zeros(shape, np.float32) for _, shape in specs], SIZES)
    rng = np.random.default_rng(9)
    means = {pid: rng.normal(size=4).astype(np.float32) for pid in SIZES}

    def upload(pid: int) -> RecordDict:
        metrics = MetricRecord({"num-examples": SIZES[pid], "train-loss": 1.0})
        return RecordDict({FEATURE_MEAN: to_record(["mean"], [means[pid]]), "metrics": metrics})

    grid = SecureClients(cfg, upload=upload)
    runner.pretrain(grid)
    want = sum(SIZES[p] * means[p] for p in SIZES) / sum(SIZES.values())
    assert runner.strategy.global_mean is not None and np.max(np.abs(runner.strategy.global_mean - want)) < 1e-3
    pretrain = runner.round_log.train["pretrain"]
    assert pretrain["used"] == 5 and pretrain["secagg"]["survivors"] == 5 and "used" not in runner.round_log.train
    assert all(FEATURE_MEAN not in content for content in grid.received)


def test_a_run_whose_rounds_train_fewer_than_three_clients_is_refused_at_its_start(tmp_path, caplog) -> None:
    import logging

    from experiments.engine.serve import serve

    raw = {"algorithm": "fedavg", "dataset": "digits", "num-rounds": 1, "secagg": "secaggplus", "fraction-train": 0.2}
    with caplog.at_level(logging.ERROR, logger="flwr"):
        assert not serve({**raw, "results-dir": str(tmp_path)}, clients=10, workers=1)
    assert (
        "secure aggregation needs at least 3 clients in a round, not 2: this run trains 2 of 10 clients a round"
        in caplog.text
    )


def test_a_distributed_dp_run_whose_rounds_are_all_colluders_is_refused_at_its_start(tmp_path, caplog) -> None:
    import logging

    from experiments.engine.serve import serve

    raw = {
        "algorithm": "fedavg",
        "dataset": "digits",
        "num-rounds": 1,
        "secagg": "secaggplus",
        "dp": "distributed",
        "dp-noise-multiplier": 1.0,
        "fraction-train": 0.4,
        "dp-colluding-clients": 4,
    }
    with caplog.at_level(logging.ERROR, logger="flwr"):
        assert not serve({**raw, "results-dir": str(tmp_path)}, clients=10, workers=1)
    assert "dp-colluding-clients 4 leaves no client of a round of 4 whose noise can be counted on" in caplog.text
