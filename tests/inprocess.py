"""Drive a strategy and its client halves in one process, without Flower's runtime (for algorithm tests)."""

from __future__ import annotations

from flwr.app import MessageType, RecordDict

from client_app.algorithms import ALGORITHMS, ClientEnv
from client_app.state import ClientState
from common.config import RunConfig
from common.data.federated import client_data, dataset_for
from common.masks import prunable_names
from common.models import array_specs, build_model, get_arrays
from common.seeding import derive_seed
from server_app.strategies import STRATEGIES
from server_app.strategies.base import ClientInfo, RoundLog

from .fakes import FakeReply


class InProcessFederation:
    """A strategy plus one client half per partition, each with its own persistent state."""

    def __init__(self, cfg: RunConfig, num_clients: int) -> None:
        data = dataset_for(cfg)
        model = build_model(cfg.model, cfg.dataset, data.input_shape, data.num_classes, derive_seed(cfg.seed, "model"))
        self.cfg = cfg
        self.strategy = STRATEGIES[cfg.algorithm](cfg, get_arrays(model), array_specs(model), None,
                                                  prunable_names(model))
        self.states = {pid: RecordDict() for pid in range(num_clients)}
        self.data = {pid: client_data(cfg, pid, num_clients) for pid in range(num_clients)}
        for pid in range(num_clients):
            self.strategy.clients[pid] = ClientInfo(pid, 1000 + pid, self.data[pid].num_train, 1)
            self.strategy.node_to_partition[1000 + pid] = pid

    def client(self, pid: int):
        """The algorithm's client half for partition `pid` (fresh object, persistent state)."""
        env = ClientEnv(self.cfg, self.data[pid], ClientState(self.states[pid]), "cpu")
        return ALGORITHMS[self.cfg.algorithm](env)

    def train_round(self, rnd: int, fresh_log: bool = True) -> dict[int, RecordDict]:
        """configure -> client fit -> aggregate, as the base strategy's round loop does; returns the replies.

        A client told to fail (drop-rate) answers with an error.
        """
        strategy = self.strategy
        strategy._round = rnd
        if fresh_log:
            strategy.round_log = RoundLog()
        sampled = strategy.sample(rnd)
        replies, messages = {}, []
        for pid, content in zip(sampled, strategy.message_contents(rnd, sampled, MessageType.TRAIN)):
            config = content.config_records["config"]
            if config.get("simulate-drop"):
                messages.append(FakeReply(1000 + pid, error="dropped"))
            else:
                replies[pid] = self.client(pid).fit(rnd, content)
                messages.append(FakeReply(1000 + pid, replies[pid]))
        strategy.aggregate_train(rnd, messages)
        strategy.round_log.train["sent"] = len(sampled)
        return replies

    def evaluate(self, rnd: int) -> dict[int, RecordDict]:
        """Every client's evaluation reply."""
        shared = self.strategy.shared_payload(rnd)
        replies = {pid: self.client(pid).evaluate(rnd, self.strategy.eval_content(rnd, pid, shared))
                   for pid in self.strategy.clients}
        self.strategy.aggregate_evaluate(rnd, [FakeReply(1000 + pid, content) for pid, content in replies.items()])
        return replies
