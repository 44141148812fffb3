"""Held-out clients (holdout-clients): chosen once and seeded, never sent a training message by any algorithm, and
evaluated as newcomers (as received and after fine-tuning) into the round's `unseen` row."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, MessageType, MetricRecord, RecordDict

from client_app.algorithms import ClientEnv, answer, client_class
from client_app.algorithms.newcomer import NewcomerClient
from client_app.state import ClientState
from common.algorithms import FINETUNED, SPECS
from common.learning.evaluate import shift_key
from common.wire.validation import PayloadError
from server_app.clients import ClientInfo, ClientRegistry
from server_app.replies import RoundLog
from server_app.results import render_markdown, summarize

from .fakes import FakeReply, PushPullGrid
from .inprocess import InProcessFederation

CLIENTS = 8


def _registry(num: int) -> ClientRegistry:
    registry = ClientRegistry()
    for pid in range(num):
        registry.add(ClientInfo(pid, 100 + pid, 10, 5))
    return registry


def test_hold_out_is_seeded_at_least_one_and_never_all() -> None:
    registry = _registry(10)
    registry.hold_out(0.2, seed=3)
    first = registry.holdout_ids()
    assert len(first) == 2 and set(first).isdisjoint(registry.ids()) and len(registry.ids()) == 8
    again = _registry(10)
    again.hold_out(0.2, seed=3)
    assert again.holdout_ids() == first
    other = _registry(10)
    other.hold_out(0.2, seed=4)
    assert other.holdout_ids() != first  # another seed, another choice (for these seeds)
    tiny = _registry(10)
    tiny.hold_out(0.01, seed=0)
    assert len(tiny.holdout_ids()) == 1
    two = _registry(2)
    two.hold_out(0.9, seed=0)
    assert len(two.holdout_ids()) == 1 and len(two.ids()) == 1
    none = _registry(5)
    none.hold_out(0.0, seed=0)
    assert none.holdout_ids() == [] and none.ids() == list(range(5))


def _federation(algorithm: str, **overrides) -> InProcessFederation:
    raw = {
        "algorithm": algorithm,
        "dataset": "digits",
        "num-rounds": 3,
        "fraction-train": 1.0,
        "local-epochs": 1,
        "lr": 0.1,
        "holdout-clients": 0.25,
        **overrides,
    }
    if algorithm == "dapperfl":
        raw["model"] = "mlp"
    fed = InProcessFederation(raw, CLIENTS)
    return fed


@pytest.mark.parametrize("algorithm", sorted(SPECS))
def test_no_algorithm_sends_a_held_out_client_a_training_message(algorithm: str) -> None:
    fed = _federation(algorithm)
    held = set(fed.clients.holdout_ids())
    assert len(held) == 2
    if fed.strategy.warmup_round():
        fed.warmup()
    for rnd in (1, 2, 3):
        contents = fed.runner.message_contents(rnd, fed.strategy.sample(rnd), MessageType.TRAIN)
        assert contents and not {c.config_records["config"]["partition-id"] for c in contents} & held
        replies = fed.train_round(rnd)
        assert not set(replies) & held
        assert not set(fed.strategy.eval_clients(rnd)) & held


@pytest.fixture
def server_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages are built as a ServerApp builds them (Flower stamps them with the run of the process)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value, raising=False)


class _Grid(PushPullGrid):
    """Answers evaluation messages in-process with each held-out client's half (or an error / a forged reply)."""

    def __init__(self, fed: InProcessFederation, forge: dict[int, RecordDict] | None = None) -> None:
        super().__init__(self.reply_all)
        self.fed, self.forge, self.sent = fed, forge or {}, []

    def reply_all(self, messages):
        replies = []
        for msg in messages:
            self.sent.append(msg)
            pid = msg.metadata.dst_node_id - 1000
            if pid in self.forge:
                replies.append(FakeReply(1000 + pid, self.forge[pid]))
                continue
            env = ClientEnv(self.fed.cfg, self.fed.data[pid], ClientState(), "cpu")
            replies.append(FakeReply(1000 + pid, answer(NewcomerClient(env), MessageType.EVALUATE, 1, msg.content)))
        return replies


@pytest.mark.parametrize("algorithm", sorted(SPECS))
def test_every_algorithm_makes_a_newcomers_model_from_its_newcomer_record(algorithm: str) -> None:
    # a split method's record holds only its shared part: the client half fills the rest as a new client would
    fed = _federation(algorithm)
    pid = sorted(fed.clients.holdout_ids())[0]
    content = fed.strategy.newcomer_content(1, pid, {})
    assert content.config_records["config"]["newcomer"] is True
    env = ClientEnv(fed.cfg, fed.data[pid], ClientState(), "cpu")
    built = client_class(algorithm)(env).newcomer_model(content)
    assert built(fed.data[pid].test_x[:4]).shape == (4, fed.data[pid].num_classes)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedamp", "local", "dmpfl", "fedper", "gpfl", "fedbabu"])
def test_newcomers_are_evaluated_as_received_and_after_fine_tuning(algorithm: str, server_identity: None) -> None:
    fed = _federation(algorithm, **{"holdout-finetune-epochs": 3})
    fed.train_round(1)
    grid = _Grid(fed)
    fed.runner.round_log = RoundLog()
    fed.runner.evaluate_newcomers(grid, 1)
    unseen = fed.round_log.unseen
    assert unseen is not None and unseen["num_clients"] == 2 and unseen["failed"] == 0
    assert {m.metadata.message_type for m in grid.sent} == {MessageType.EVALUATE}
    assert all(m.content.config_records["config"]["newcomer"] is True for m in grid.sent)
    for degree in fed.cfg.shift_degrees:
        assert 0.0 <= unseen["mean"][shift_key(degree)] <= 1.0
        assert 0.0 <= unseen["mean"][FINETUNED.prefix + shift_key(degree)] <= 1.0
    # three epochs of fine-tuning on the client's own data help a model that saw one round of training
    assert unseen["mean"][FINETUNED.prefix + shift_key(0.0)] > unseen["mean"][shift_key(0.0)]
    assert fed.round_log.bytes["eval_down"] > 0 and fed.round_log.bytes["eval_up"] > 0


def test_a_newcomer_reply_without_its_fine_tuned_rows_is_rejected(server_identity: None) -> None:
    fed = _federation("fedavg")
    forged_pid = fed.clients.holdout_ids()[0]
    metrics = {"num-test": 5, "loss": 1.0, "server-round": 1, **{shift_key(d): 0.5 for d in fed.cfg.shift_degrees}}
    fed.runner.evaluate_newcomers(_Grid(fed, {forged_pid: RecordDict({"metrics": MetricRecord(metrics)})}), 1)
    assert fed.round_log.unseen is not None and fed.round_log.unseen["failed"] == 1
    assert fed.round_log.unseen["num_clients"] == 1


def test_a_newcomer_refuses_training_and_too_many_epochs() -> None:
    fed = _federation("fedavg")
    env = ClientEnv(fed.cfg, fed.data[0], ClientState(), "cpu")
    with pytest.raises(PayloadError, match="never trains"):
        NewcomerClient(env).fit(1, RecordDict())
    content = fed.runner.message_contents(1, [0], MessageType.EVALUATE, newcomers=True)[0]
    content["config"] = ConfigRecord({**dict(content.config_records["config"]), "finetune-epochs": 101})
    with pytest.raises(PayloadError, match="finetune-epochs"):
        NewcomerClient(env).evaluate(1, content)


def test_the_summary_has_the_unseen_row() -> None:
    degrees = [0.0, 1.0]
    unseen = {
        "num_clients": 2,
        "failed": 0,
        "mean": {"acc-shift-0": 0.5, "acc-shift-1": 0.25, "finetuned-acc-shift-0": 0.75, "finetuned-acc-shift-1": 0.5},
        "std": dict.fromkeys(["acc-shift-0", "acc-shift-1", "finetuned-acc-shift-0", "finetuned-acc-shift-1"], 0.0),
    }
    record = {
        "round": 1,
        "wall_s": 1.0,
        "train": {"used": 1, "sent": 1},
        "bytes": dict.fromkeys(["train_down", "train_up", "eval_down", "eval_up"], 0),
        "eval": {
            "mean": {"acc-shift-0": 0.9, "acc-shift-1": 0.8},
            "std": {"acc-shift-0": 0.0, "acc-shift-1": 0.0},
            "num_clients": 6,
        },
        "unseen": unseen,
    }
    summary = summarize([record], {"shift_degrees": degrees, "num_clients": 8})
    assert summary["unseen"] == unseen
    text = render_markdown(summary)
    assert "| as received | 50.00 +/- 0.00 | 25.00 +/- 0.00 |" in text
    assert "| after fine-tuning | 75.00 +/- 0.00 | 50.00 +/- 0.00 |" in text
    assert np.isclose(summary["final"]["mean"]["acc-shift-0"], 0.9)
