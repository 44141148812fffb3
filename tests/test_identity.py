"""A partition is bound to the node that claimed it first: take-overs only after its holder has been gone for
`takeover-after` seconds, duplicate and unknown claims refused with a log line (issue: client identity)."""

from __future__ import annotations

import logging
import time

import pytest
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from common.config import ConfigError, parse_run_config
from server_app import clients as clients_module
from server_app.clients import ClientRegistry
from server_app.takeover import AfterTimeout, OperatorConsent, allow

from .fakes import BlockingGrid, FakeReply
from .inprocess import InProcessFederation


class ClaimGrid(BlockingGrid):
    """Connected nodes and the partition each one claims in the handshake (num-partitions 8)."""

    def __init__(self, claims: dict[int, int], num_train: dict[int, int] | None = None) -> None:
        self.claims = dict(claims)
        self.num_train = num_train or {}
        self.asked: list[int] = []

    def get_node_ids(self) -> list[int]:
        return list(self.claims)

    def send_and_receive(self, messages, timeout):
        self.asked += [m.metadata.dst_node_id for m in messages]
        return [
            FakeReply(
                m.metadata.dst_node_id,
                RecordDict(
                    {
                        "metrics": MetricRecord(
                            {
                                "partition-id": self.claims[m.metadata.dst_node_id],
                                "num-partitions": 8,
                                "num-train": self.num_train.get(m.metadata.dst_node_id, 100),
                                "num-test": 10,
                            }
                        )
                    }
                ),
            )
            for m in messages
        ]


class CountingClaimGrid(ClaimGrid):
    """A ClaimGrid that notes the most queries out at once."""

    most_out = 0

    def push_messages(self, messages):
        ids = super().push_messages(messages)
        self.most_out = max(self.most_out, len(self.__dict__["_pushed"]))
        return ids


def test_the_handshake_keeps_at_most_messages_in_flight_queries_out() -> None:
    """Every SuperNode's ClientApp starts when its query arrives: on one machine hosting many (a test rig, the load
    bench) a handshake of all at once needs ~0.5 GB per node together; messages-in-flight bounds it as it bounds
    a round's messages."""
    claims = {100 + i: i for i in range(7)}
    windowed, unbounded = CountingClaimGrid(claims), CountingClaimGrid(claims)
    bounded_registry = ClientRegistry(window=3)
    bounded_registry.handshake(windowed, timeout=5)
    ClientRegistry().handshake(unbounded, timeout=5)
    assert windowed.most_out == 3 and sorted(bounded_registry.ids()) == list(range(7))
    assert unbounded.most_out == 7


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def server_identity(monkeypatch):
    """Flower's Message needs a running app's identity: this process is the server's."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", 0)):
        monkeypatch.setattr(TaskIdentity, name, value, raising=False)


def registry(claims: dict[int, int], clock: Clock, takeover_after: float = 120.0, consent=None) -> ClientRegistry:
    clients = ClientRegistry(takeover_after=takeover_after, clock=clock, consent=consent or AfterTimeout())
    clients.handshake(ClaimGrid(claims), timeout=5)
    return clients


def test_a_node_cannot_take_a_partition_whose_holder_is_connected(caplog) -> None:
    clock = Clock()
    clients = registry({1: 0, 2: 1}, clock)
    grid = ClaimGrid({1: 0, 2: 1, 99: 0})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        for _ in range(4):  # round after round, with plenty of time passing: the holder stays
            assert clients.refresh(grid, timeout=5) == []
            clock.now += 300
    assert clients[0].node_id == 1 and clients.node_to_partition == {1: 0, 2: 1}
    assert "node 99: handshake rejected: claims partition 0, held by node 1, which is connected" in caplog.text


def test_two_nodes_claiming_one_partition_do_not_swap_it() -> None:
    clock = Clock()
    clients = registry({1: 0, 2: 0, 3: 1}, clock)
    assert clients[0].node_id == 1 and len(clients) == 2  # the first claimant keeps it
    grid = ClaimGrid({1: 0, 2: 0, 3: 1})
    holders = []
    for _ in range(5):
        clients.refresh(grid, timeout=5)
        holders.append(clients[0].node_id)
        clock.now += 50
    assert holders == [1] * 5
    assert grid.asked == [2], "a refused node is asked again only every takeover-after seconds (250 s passed)"


def test_a_take_over_waits_until_the_holder_has_been_gone_long_enough(caplog, tmp_path) -> None:
    clock = Clock()
    clients = registry({1: 0, 2: 1}, clock, consent=OperatorConsent(tmp_path))
    grid = ClaimGrid({2: 1, 99: 0})  # node 1 is gone; node 99 claims its partition
    clock.now += 10
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert clients.refresh(grid, timeout=5) == []
        assert "held by node 1, which has been gone for 10 s; a take-over needs 120 s" in caplog.text
        clock.now += 60
        assert clients.refresh(grid, timeout=5) == [] and grid.asked == [99], "not asked again before 120 s"
        clock.now += 70  # gone long enough, but the operator has not consented
        assert clients.refresh(grid, timeout=5) == [] and clients[0].node_id == 1
        assert f"a take-over needs the operator's consent: pflower allow-takeover {tmp_path} 0 --node 99" in caplog.text
        allow(tmp_path, [0], 98)  # a consent for another node serves that node only
        clock.now += 130
        assert clients.refresh(grid, timeout=5) == [] and clients[0].node_id == 1
        allow(tmp_path, [0], 99)
        clock.now += 130
        assert clients.refresh(grid, timeout=5) == [0]
    assert (tmp_path / "takeover-allowed").read_text() == "0 98\n", "a consent serves one take-over, by its node"
    assert clients[0].node_id == 99 and clients.node_to_partition == {2: 1, 99: 0}
    assert "node 99 took over partition 0 from node 1, gone for 400 s" in caplog.text
    # the old holder comes back: the new one is connected, so it is refused
    back = ClaimGrid({1: 0, 2: 1, 99: 0})
    clock.now += 500
    assert clients.refresh(back, timeout=5) == [] and clients[0].node_id == 99


def test_the_operator_consents_with_pflower_allow_takeover(tmp_path, capsys) -> None:
    from experiments.cli import main

    assert main(["allow-takeover", str(tmp_path), "3", "--node", "7"]) == 2  # not a run folder
    assert "is not a run folder" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit):  # a consent names its node: "any node" would go to whoever asks first
        main(["allow-takeover", str(tmp_path), "3"])
    assert "--node" in capsys.readouterr().err
    big = 2**64 - 1  # Flower's node ids are unsigned 64-bit integers: 20 digits
    assert main(["allow-takeover", str(tmp_path), "3", "5", "--node", "7"]) == 0
    assert main(["allow-takeover", str(tmp_path), "6", "--node", str(big)]) == 0
    assert main(["allow-takeover", str(tmp_path), "6", "--node", str(2**64)]) == 2
    consent = OperatorConsent(tmp_path)
    assert not consent.allows(4, 7) and consent.allows(5, 7) and not consent.allows(5, 7)
    assert not consent.allows(3, 8), "a consent naming a node serves that node only"
    assert consent.allows(3, 7) and not consent.allows(6, 98)
    assert consent.allows(6, big) and not consent.allows(6, big)


def test_a_consent_file_that_cannot_be_trusted_is_no_consent_and_no_crash(tmp_path, caplog) -> None:
    import os

    consent = OperatorConsent(tmp_path)
    target = tmp_path / "elsewhere"
    target.write_text("0\n")
    (tmp_path / "takeover-allowed").symlink_to(target)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert not consent.allows(0, 1)  # a link is never followed
        assert "take-over consent not used" in caplog.text and target.read_text() == "0\n"
        (tmp_path / "takeover-allowed").unlink()
        (tmp_path / "takeover-allowed").write_text("0\n")
        os.chmod(tmp_path / "takeover-allowed", 0o666)  # writable by others: anyone could grant
        assert not consent.allows(0, 1) and "writable by it alone" in caplog.text
        os.chmod(tmp_path / "takeover-allowed", 0o600)
        (tmp_path / "takeover-allowed").write_bytes("\u00b2\n\xff\xfe\n1 2 3\n-4\n".encode("utf-8", "surrogateescape"))
        assert not consent.allows(2, 1), "lines that are not plain ids are ignored, never a crash"
    allow(tmp_path, [0], 5)
    assert consent.allows(0, 5)


def test_by_default_a_gone_holder_is_never_replaced_without_the_operator(caplog) -> None:
    clock = Clock()
    clients = ClientRegistry(clock=clock)  # what server_app.app builds for takeover = "operator"
    clients.handshake(ClaimGrid({1: 0}), timeout=5)
    for _ in range(5):
        clock.now += 1000
        assert clients.refresh(ClaimGrid({7: 0}), timeout=5) == [] and clients[0].node_id == 1
    assert parse_run_config({}).takeover == "operator"


def test_a_take_over_must_declare_the_partitions_first_counts(caplog) -> None:
    clock = Clock()
    clients = registry({1: 0}, clock, takeover_after=0.0)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert clients.refresh(ClaimGrid({7: 0}, num_train={7: 100_000}), timeout=5) == []
    assert clients[0].node_id == 1 and clients[0].num_train == 100
    assert "claims partition 0 with 100000 training and 10 test samples; it was declared with 100 and 10" in caplog.text
    clock.now += 1
    assert clients.refresh(ClaimGrid({8: 0}), timeout=5) == [0] and clients[0].num_train == 100


def test_with_takeover_after_zero_a_gone_holder_is_replaced_at_once() -> None:
    clock = Clock()
    clients = registry({1: 0}, clock, takeover_after=0.0)
    assert clients.refresh(ClaimGrid({7: 0}), timeout=5) == [0] and clients[0].node_id == 7
    with pytest.raises(ConfigError, match="takeover-after"):
        parse_run_config({"takeover-after": -1})


def test_claims_outside_the_declared_partitions_are_refused(caplog) -> None:
    clock = Clock()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        clients = registry({1: 0, 2: 8}, clock)
    assert clients.ids() == [0] and "node 2: handshake rejected: claims partition 8 of 8" in caplog.text


@pytest.mark.parametrize("algorithm", ["fedamp", "fedfomo", "fedavg"])
def test_a_late_node_with_an_unknown_partition_is_refused_and_the_run_goes_on(algorithm: str, caplog) -> None:
    raw = (
        {
            "algorithm": algorithm,
            "dataset": "digits",
            "num-rounds": 3,
            "fraction-train": 1.0,
            "local-epochs": 1,
            "pretrain-epochs": 0,
        }
        if algorithm == "fedamp"
        else {"algorithm": algorithm, "dataset": "digits", "num-rounds": 3, "fraction-train": 1.0, "local-epochs": 1}
    )
    fed = InProcessFederation(raw, 3)
    fed.train_round(1)
    grid = ClaimGrid({1000 + pid: pid for pid in range(3)} | {77: 5, 78: 3})  # 3 is in range but not in this run
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert fed.clients.refresh(grid, timeout=5) == []
    assert fed.clients.ids() == [0, 1, 2]
    assert (
        "node 77: handshake rejected: claims partition 5, which is not one of the 3 partitions of this run"
        in caplog.text
    )
    assert "node 78: handshake rejected: claims partition 3" in caplog.text
    fed.train_round(2)
    assert fed.round_log.train["used"] == 3
    fed.evaluate(2)
    assert fed.round_log.eval["num_clients"] == 3


class FailingGrid(ClaimGrid):
    """Every node answers the handshake with the same error (e.g. a partition that cannot be made)."""

    def send_and_receive(self, messages, timeout):
        self.asked += [m.metadata.dst_node_id for m in messages]
        return [FakeReply(m.metadata.dst_node_id, error="DataError: 25 clients for 10 samples") for m in messages]


def test_a_fault_every_node_shares_is_logged_once_and_named_when_the_run_stops(caplog) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="flwr"),
        pytest.raises(
            clients_module.RunAborted, match="no client answered the handshake: DataError: 25 clients for 10 samples"
        ),
    ):
        ClientRegistry().handshake(FailingGrid({n: 0 for n in range(50)}), timeout=5)
    assert "failed the handshake" not in caplog.text, "said once, in the reason the run stops"


class PartlyRefusingGrid(ClaimGrid):
    """Nodes 0-2 refuse (their data cannot be made), each with the same reason; the others answer."""

    def send_and_receive(self, messages, timeout):
        refused = RecordDict({"refused": ConfigRecord({"reason": "too few samples\n\x1b[31mfake log line"})})
        return [
            FakeReply(m.metadata.dst_node_id, refused) if m.metadata.dst_node_id < 3 else reply
            for m, reply in zip(messages, super().send_and_receive(messages, timeout))
        ]


def test_a_refusing_node_is_counted_once_per_reason_with_its_text_made_printable(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="flwr"):
        clients = ClientRegistry()
        clients.handshake(PartlyRefusingGrid({n: n for n in range(6)}), timeout=5)
    assert clients.ids() == [3, 4, 5]
    assert caplog.text.count("failed the handshake") == 1
    assert "3 node(s) failed the handshake: too few samples??[31mfake log line" in caplog.text


def test_a_resumed_run_keeps_the_partitions_and_counts_of_its_checkpoint(caplog) -> None:
    before = {0: (10, 100, 10), 1: (2, 100, 10)}  # partition -> (node, train, test) as the checkpoint holds it

    def resumed(claims: ClaimGrid) -> ClientRegistry:
        clients = ClientRegistry(clock=Clock())
        clients.expect(before)
        with caplog.at_level(logging.WARNING, logger="flwr"):
            clients.handshake(claims, timeout=5)
        return clients

    # node 7 inflates partition 0's counts, node 9 claims a partition the run never had
    clients = resumed(ClaimGrid({7: 0, 2: 1, 9: 5}, num_train={7: 100_000}))
    assert clients.table() == {1: (2, 100, 10)}
    assert "claims partition 0 with 100000 training and 10 test samples; the run being resumed fixed 100 and 10" in (
        caplog.text
    )
    assert "node 9: handshake rejected: claims partition 5, which is not one of the" in caplog.text
    # the holder before the restart is connected: a newcomer answering first cannot take its partition
    clients = resumed(ClaimGrid({3: 0, 10: 0, 2: 1}))
    assert clients.table() == before
    assert "node 3: handshake rejected: claims partition 0, held by node 10 before the restart, which is connected" in (
        caplog.text
    )
    # it is gone: in a simulation (new node ids at every start, all the run's own) a claim with the checkpoint's
    # counts is taken
    simulation = ClientRegistry(clock=Clock(), simulated=True)
    simulation.expect(before)
    simulation.handshake(ClaimGrid({3: 0, 4: 1}), timeout=5)
    assert simulation.table() == {0: (3, 100, 10), 1: (4, 100, 10)}


def test_a_resumed_deployment_treats_another_claimant_as_a_take_over(caplog, tmp_path) -> None:
    """A node claiming a partition whose holder before the restart is offline gets it (and its personal model)
    only as a take-over: the holder gone takeover-after seconds since the resume, and the operator's consent."""
    clock = Clock()
    clients = ClientRegistry(clock=clock, consent=OperatorConsent(tmp_path))  # a deployment: not simulated
    clients.expect({0: (10, 100, 10), 1: (2, 100, 10)})
    grid = ClaimGrid({66: 0, 2: 1})  # node 10 has not come back; node 66 claims its partition first
    with caplog.at_level(logging.WARNING, logger="flwr"):
        clients.handshake(grid, timeout=5)
        assert clients.table() == {1: (2, 100, 10)}, "the attacker's claim is not bound"
        assert (
            "node 66: handshake rejected: claims partition 0, held by node 10 before the restart, which has been "
            "gone for 0 s since the resume; a take-over needs 120 s"
        ) in caplog.text
        clock.now += 130
        assert clients.refresh(grid, timeout=5) == [] and 0 not in clients, "gone long enough: still no consent"
        assert f"pflower allow-takeover {tmp_path} 0 --node 66" in caplog.text
        back = ClaimGrid({66: 0, 2: 1, 10: 0})  # the real holder returns: it gets its partition back
        assert clients.refresh(back, timeout=5) == [] and clients.table()[0] == (10, 100, 10)
    # with the operator's consent, a replaced device takes it over (and the strategy forgets the old holder)
    clients = ClientRegistry(clock=clock, consent=OperatorConsent(tmp_path))
    clients.expect({0: (10, 100, 10), 1: (2, 100, 10)})
    clients.handshake(grid, timeout=5)
    allow(tmp_path, [0], 66)
    clock.now += 130
    assert clients.refresh(grid, timeout=5) == [0] and clients.table()[0] == (66, 100, 10)
    assert clients.ids() == [0, 1]


def test_a_resumed_run_holds_out_the_same_clients_when_some_are_offline() -> None:
    before = {pid: (100 + pid, 100, 10) for pid in range(8)}
    full = ClientRegistry(clock=Clock())
    full.expect(before)
    full.handshake(ClaimGrid({100 + pid: pid for pid in range(8)}), timeout=5)
    full.hold_out(0.25, seed=3)
    part = ClientRegistry(clock=Clock())
    part.expect(before)
    part.handshake(ClaimGrid({100 + pid: pid for pid in range(0, 8, 2)}), timeout=5)  # half are offline
    part.hold_out(0.25, seed=3)
    assert part.held_out == full.held_out and len(full.held_out) == 2


class SlowStartGrid(ClaimGrid):
    """Nodes answer a query `delay` s after it was sent (a ClientApp process starting; a dict: per node); `silent`
    nodes never do, `failing` ones answer with an error."""

    def __init__(self, claims: dict[int, int], delay: float | dict[int, float], silent=(), failing=()) -> None:
        super().__init__(claims)
        self.delay = delay if isinstance(delay, dict) else dict.fromkeys(claims, delay)
        self.silent, self.failing = set(silent), set(failing)
        self.sent_at: dict[str, float] = {}
        self.by_id: dict[str, int] = {}

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        self.sent_at.update(dict.fromkeys(ids, time.monotonic()))
        self.by_id.update((mid, m.metadata.dst_node_id) for mid, m in zip(ids, messages))
        return ids

    def pull_messages(self, message_ids):
        now = time.monotonic()
        ready = [
            m
            for m in message_ids
            if now >= self.sent_at[m] + self.delay[self.by_id[m]] and self.by_id[m] not in self.silent
        ]
        return super().pull_messages(ready)

    def send_and_receive(self, messages, timeout):
        return [
            FakeReply(m.metadata.dst_node_id, error="The FAB could not be verified.")
            if m.metadata.dst_node_id in self.failing
            else reply
            for m, reply in zip(messages, super().send_and_receive(messages, timeout))
        ]


def test_the_first_handshake_waits_for_client_apps_to_start_beyond_a_short_round_timeout(monkeypatch) -> None:
    """The run's first message starts every node's ClientApp (tens of seconds on a loaded machine or a Pi): the
    first handshake waits at least FIRST_HANDSHAKE_TIMEOUT_S, whatever round-timeout says."""
    monkeypatch.setattr(clients_module, "FIRST_HANDSHAKE_TIMEOUT_S", 1.5)
    cfg = parse_run_config({"round-timeout": 0.1})
    clients = ClientRegistry()
    clients.start(SlowStartGrid({1: 0, 2: 1}, delay=0.4), cfg)
    assert clients.ids() == [0, 1]


def test_the_first_handshake_waits_while_nodes_keep_answering_and_stops_after_the_last(monkeypatch, caplog) -> None:
    """20 ClientApps starting at once on 2 cores answer one after another, the last minutes after the query: each
    answer starts the first handshake's wait again, so none of them is left out of the run (its partitions are fixed
    then); a node that never answers is given up the wait after the last answer. Joiners keep their own timeout."""
    monkeypatch.setattr(clients_module, "FIRST_HANDSHAKE_TIMEOUT_S", 0.5)
    delays = {node: 0.3 * node for node in range(1, 6)}  # 0.3 .. 1.5 s: all but the first later than 0.5 s alone
    grid = SlowStartGrid({node: node - 1 for node in range(1, 7)}, delay={**delays, 6: 0.0}, silent={6})
    clients = ClientRegistry()
    begun = time.monotonic()
    with caplog.at_level(logging.WARNING):
        clients.start(grid, parse_run_config({"round-timeout": 0.1}))
    assert clients.ids() == [0, 1, 2, 3, 4]
    assert time.monotonic() - begun >= 1.5 + 0.5  # node 6 given up 0.5 s after the last answer, not before
    assert "1 message(s) unanswered 0.5 s" in caplog.text
    caplog.clear()
    late = SlowStartGrid({7: 0, 8: 1, 9: 2}, delay={7: 0.3, 8: 1.0, 9: 1.5})
    with caplog.at_level(logging.WARNING):
        clients.handshake(late, timeout=0.5, node_ids=[7, 8, 9])
    assert "2 message(s) unanswered 0.5 s" in caplog.text  # joiners: an answer does not extend the others' wait


def test_a_handshake_nobody_answers_names_the_failures_and_the_silent_nodes() -> None:
    grid = SlowStartGrid({1: 0, 2: 1, 3: 2}, delay=0.0, silent={2, 3}, failing={1})
    with pytest.raises(
        clients_module.RunAborted,
        match=r"no client answered the handshake: The FAB could not be verified\.; 2 node\(s\) did not answer within "
        r"0\.3 s",
    ):
        ClientRegistry().handshake(grid, timeout=0.3)
