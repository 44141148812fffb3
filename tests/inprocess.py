"""A federation for algorithm tests: the real round runner on the in-process engine's grid with its workers inline
(workers=0), so every message is built by the runner, serialized as Flower serializes it, answered by the
ClientApp and checked and folded by the runner, in one process; the harness only records what went by and exposes
the state in between."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from flwr.app import Message, MessageType, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID

from client_app.algorithms import ClientAlgorithm, ClientEnv, client_class
from client_app.state import ClientState, Kept, Tree
from common.config import RunConfig, parse_run_config
from common.data.federated import client_data, dataset_for
from common.learning.models import ModelLayout, build_model
from common.seeding import derive_seed
from experiments.engine.grid import FIRST_NODE_ID, InProcessGrid
from experiments.engine.states import unpack
from server_app.clients import ClientRegistry
from server_app.flower_private import set_task_identity
from server_app.replies import RoundLog
from server_app.runner import RoundRunner
from server_app.strategies import strategy_class


class RecordingGrid(InProcessGrid):
    """The in-process grid, answering inline, that keeps the training messages it carried and the replies it
    returned (by partition) until the harness takes them."""

    def __init__(self, run_config: dict[str, Any], num_nodes: int) -> None:
        super().__init__(run_config, num_nodes, workers=0)
        self.train_sent: dict[int, RecordDict] = {}
        self.answered: dict[int, RecordDict] = {}

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        messages = list(messages)
        for msg in messages:
            if msg.metadata.message_type == MessageType.TRAIN:
                self.train_sent[msg.metadata.dst_node_id - FIRST_NODE_ID] = msg.content
        return super().push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        replies = list(super().pull_messages(message_ids))
        for reply in replies:
            if not reply.has_error():
                self.answered[reply.metadata.src_node_id - FIRST_NODE_ID] = reply.content
        return replies

    def take(self) -> tuple[dict[int, RecordDict], dict[int, RecordDict]]:
        """The training messages and the replies since the last call."""
        sent, answered = self.train_sent, self.answered
        self.train_sent, self.answered = {}, {}
        return sent, answered


class InProcessFederation:
    """The configured strategy and its round runner, the handshake done with `num_clients` nodes of the in-process
    engine; rounds are driven one phase at a time so tests can look in between."""

    def __init__(self, raw: Mapping[str, Any], num_clients: int) -> None:
        run_config = {"device": "cpu", **raw}
        cfg: RunConfig = parse_run_config(run_config)
        data = dataset_for(cfg.data)
        model = build_model(cfg.model, cfg.dataset, data.input_shape, data.num_classes, derive_seed(cfg.seed, "model"))
        self.cfg, self.num_clients = cfg, num_clients
        self.clients = ClientRegistry(
            max_samples=cfg.max_client_samples, takeover_after=cfg.takeover_after, max_weight_ratio=cfg.max_weight_ratio
        )
        self.strategy = strategy_class(cfg.algorithm)(cfg, ModelLayout.of(model), self.clients)
        self.runner = RoundRunner(cfg, self.strategy, self.clients)
        self.grid = RecordingGrid(run_config, num_clients)
        set_task_identity(self.grid.run.run_id, SUPERLINK_NODE_ID, self.grid.run.run_id)  # as a ServerApp's process
        weakref.finalize(self, self.grid.close)
        self.clients.start(self.grid, cfg)
        self.grid.take()
        self.sent: dict[int, dict[int, RecordDict]] = {}  # the training messages of each round, by partition
        self.data = {pid: client_data(cfg.data, pid, num_clients) for pid in range(num_clients)}

    @property
    def round_log(self) -> RoundLog:
        """The runner's counters of the round in progress."""
        return self.runner.round_log

    def state(self, pid: int) -> Tree:
        """A copy of the client state the engine holds for partition `pid` ({}: none)."""
        block = self.grid.held.get(FIRST_NODE_ID + pid)
        return {} if block is None else unpack(block).tree

    @property
    def states(self) -> dict[int, Tree]:
        """Every partition's client state (copies)."""
        return {pid: self.state(pid) for pid in range(self.num_clients)}

    def set_state(self, pid: int, tree: Tree, server_round: int | None = None) -> None:
        """Replace partition `pid`'s client state, as if its message of `server_round` (default: the round of the
        state it replaces, else 0) had left `tree` ({}: the device lost its state)."""
        node = FIRST_NODE_ID + pid
        held = self.grid.held.get(node)
        if server_round is None:
            server_round = 0 if held is None else held.server_round
        if tree:
            self.grid.hold_state(node, Kept(server_round, tree, None, None, dirty=False))
        else:
            self.grid.held.discard(node)

    def client(self, pid: int) -> ClientAlgorithm:
        """The algorithm's client half for partition `pid` on a copy of its state (what it saves stays with it)."""
        env = ClientEnv(self.cfg, self.data[pid], ClientState(self.state(pid)), "cpu")
        return client_class(self.cfg.algorithm)(env)

    def train_round(self, rnd: int, fresh_log: bool = True) -> dict[int, RecordDict]:
        """The runner's training phase of round `rnd` (a pre-training round 0 only where a test calls `warmup`);
        returns the replies by partition."""
        if fresh_log:
            self.runner.round_log = RoundLog.starting(self.cfg.message_digests)
        self.runner.train(self.grid, rnd)
        self.sent[rnd], replies = self.grid.take()
        return replies

    def warmup(self) -> None:
        """The runner's pre-training round 0 for every client."""
        self.runner.pretrain(self.grid)
        self.grid.take()

    def evaluate(self, rnd: int) -> dict[int, RecordDict]:
        """The runner's evaluation phase of round `rnd`; returns the replies by partition."""
        self.runner.evaluate(self.grid, rnd)
        return self.grid.take()[1]
