"""Drive an algorithm's server half (through the round runner) and its client halves in one process, without
Flower's runtime (for algorithm tests)."""

from __future__ import annotations

from flwr.app import MessageType, RecordDict

from client_app.algorithms import ClientAlgorithm, ClientEnv, answer, client_class
from client_app.state import ClientState, Tree
from common.config import RunConfig
from common.data.federated import client_data, dataset_for
from common.models import ModelLayout, build_model
from common.seeding import derive_seed
from server_app.clients import ClientInfo, ClientRegistry
from server_app.replies import RoundLog
from server_app.runner import RoundRunner
from server_app.strategies import strategy_class

from .fakes import FakeReply


class InProcessFederation:
    """A round runner with the configured strategy, plus one client half per partition with its own state."""

    def __init__(self, cfg: RunConfig, num_clients: int, device: str = "cpu") -> None:
        data = dataset_for(cfg.data)
        model = build_model(cfg.model, cfg.dataset, data.input_shape, data.num_classes, derive_seed(cfg.seed, "model"))
        self.cfg = cfg
        self.device = device  # where the client halves train and evaluate
        self.clients = ClientRegistry()
        self.strategy = strategy_class(cfg.algorithm)(cfg, ModelLayout.of(model), self.clients)
        self.runner = RoundRunner(cfg, self.strategy, self.clients)
        self.states: dict[int, Tree] = {pid: {} for pid in range(num_clients)}
        self.sent: dict[int, dict[int, RecordDict]] = {}  # the training messages of each round, by partition
        self.data = {pid: client_data(cfg.data, pid, num_clients) for pid in range(num_clients)}
        for pid in range(num_clients):
            self.clients.add(ClientInfo(pid, 1000 + pid, self.data[pid].num_train, 1))

    @property
    def round_log(self) -> RoundLog:
        """The runner's counters of the round in progress."""
        return self.runner.round_log

    def client(self, pid: int) -> ClientAlgorithm:
        """The algorithm's client half for partition `pid` (fresh object, persistent state)."""
        env = ClientEnv(self.cfg, self.data[pid], ClientState(self.states[pid]), self.device)
        return client_class(self.cfg.algorithm)(env)

    def exchange(self, rnd: int, sampled: list[int]) -> tuple[dict[int, RecordDict], list[FakeReply]]:
        """Training messages to `sampled`, each answered by its client half (an error when told to fail)."""
        replies, messages = {}, []
        self.sent[rnd] = dict(zip(sampled, self.runner.message_contents(rnd, sampled, MessageType.TRAIN)))
        for pid, content in self.sent[rnd].items():
            if content.config_records["config"].get("simulate-drop"):
                messages.append(FakeReply(1000 + pid, error="dropped"))
            else:
                replies[pid] = answer(self.client(pid), MessageType.TRAIN, rnd, content)
                messages.append(FakeReply(1000 + pid, replies[pid]))
        return replies, messages

    def train_round(self, rnd: int, fresh_log: bool = True) -> dict[int, RecordDict]:
        """configure -> client fit -> aggregate, as the runner's loop does (a warm-up round 0 only where a test
        calls `warmup`); returns the replies."""
        if fresh_log:
            self.runner.round_log = RoundLog()
        sampled = self.strategy.sample(rnd)
        replies, messages = self.exchange(rnd, sampled)
        self.runner.aggregate_train(rnd, messages)
        self.runner.round_log.train["sent"] = len(sampled)
        return replies

    def warmup(self) -> None:
        """Round 0 for every client, as RoundRunner.warmup does."""
        _, messages = self.exchange(0, self.clients.ids())
        accepted, _, _ = self.runner.accept_train_replies(0, messages, "pre-training")
        self.strategy.aggregate(0, accepted)

    def evaluate(self, rnd: int) -> dict[int, RecordDict]:
        """Every client's evaluation reply."""
        contents = self.runner.message_contents(rnd, self.clients.ids(), MessageType.EVALUATE)
        replies = {
            pid: answer(self.client(pid), MessageType.EVALUATE, rnd, content)
            for pid, content in zip(self.clients.ids(), contents)
        }
        self.runner.aggregate_evaluate(rnd, [FakeReply(1000 + pid, content) for pid, content in replies.items()])
        return replies
