"""The federation's clients as the server knows them: the handshake that maps nodes to partitions, and seeded
sampling of partitions (independent of Flower's random node ids)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from logging import INFO, WARNING

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from common.seeding import derive_seed
from common.validation import PayloadError, read_count


class RunAborted(RuntimeError):
    """The run cannot go on (e.g. no client answered the handshake); the message says why."""


@dataclass(frozen=True)
class ClientInfo:
    """What a client told the server in the handshake."""

    partition_id: int
    node_id: int
    num_train: int
    num_test: int


@dataclass
class ClientRegistry:
    """Partition id -> client, and node id -> partition id."""

    by_partition: dict[int, ClientInfo] = field(default_factory=dict)
    node_to_partition: dict[int, int] = field(default_factory=dict)
    max_samples: int = 100_000  # run-config max-client-samples: a larger declared count is refused

    def add(self, info: ClientInfo) -> None:
        """Register (or replace) the client of a partition."""
        self.by_partition[info.partition_id] = info
        self.node_to_partition[info.node_id] = info.partition_id

    def ids(self) -> list[int]:
        """Partition ids, sorted."""
        return sorted(self.by_partition)

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids())

    def __len__(self) -> int:
        return len(self.by_partition)

    def __contains__(self, partition_id: object) -> bool:
        return partition_id in self.by_partition

    def __getitem__(self, partition_id: int) -> ClientInfo:
        return self.by_partition[partition_id]

    def total_train(self) -> int:
        """Training samples of all clients, as they declared them."""
        return sum(c.num_train for c in self.by_partition.values())

    def handshake(self, grid: Grid, timeout: float, node_ids: list[int] | None = None) -> list[int]:
        """Ask connected nodes (all, or `node_ids`) for their partition and data sizes; keep consistent answers.

        Returns the partitions a joining node took over. A node that joins later and claims a partition already
        held takes it over (a device replaced, or a SuperNode started with another key); in the first handshake
        the first claimant keeps it.
        """
        joining = node_ids is not None
        nodes = sorted(grid.get_node_ids()) if node_ids is None else sorted(node_ids)
        if not nodes:
            raise RunAborted("no SuperNode is connected")
        messages = [Message(content=RecordDict({"config": ConfigRecord({"server-round": 0})}), dst_node_id=node,
                            message_type=MessageType.QUERY) for node in nodes]
        sizes: set[int] = set()
        replaced: list[int] = []
        for msg in grid.send_and_receive(messages, timeout=timeout):
            node = msg.metadata.src_node_id
            if msg.has_error():
                log(WARNING, "node %s failed the handshake: %s", node, msg.error.reason)
                continue
            metrics = msg.content.metric_records.get("metrics")
            try:
                pid = read_count(metrics, "partition-id", allow_zero=True)
                info = ClientInfo(pid, node, read_count(metrics, "num-train"), read_count(metrics, "num-test"))
                sizes.add(read_count(metrics, "num-partitions"))
                if max(info.num_train, info.num_test) > self.max_samples:
                    raise PayloadError(f"declares {info.num_train} training and {info.num_test} test samples, above "
                                       f"max-client-samples = {self.max_samples}")
            except PayloadError as exc:
                log(WARNING, "node %s: handshake rejected: %s", node, exc)
                continue
            if pid in self and not joining:
                log(WARNING, "node %s claims partition %d, already held by node %s: ignored",
                    node, pid, self[pid].node_id)
                continue
            if pid in self:
                old = self[pid].node_id
                self.node_to_partition.pop(old, None)
                replaced.append(pid)
                log(INFO, "node %s took over partition %d from node %s", node, pid, old)
            elif joining:
                log(INFO, "node %s joined with partition %d", node, pid)
            self.add(info)
        if joining:
            return replaced
        if not self.by_partition:
            raise RunAborted("no client answered the handshake (see the warnings above)")
        if len(sizes) > 1:
            log(WARNING, "clients disagree on num-partitions: %s", sorted(sizes))
        log(INFO, "handshake: %d of %d nodes ready, %d training samples in all",
            len(self), len(nodes), self.total_train())
        return replaced

    def refresh(self, grid: Grid, timeout: float) -> list[int]:
        """Handshake nodes that connected since the last round (new or restarted SuperNodes); partitions taken over."""
        new = sorted(set(grid.get_node_ids()) - set(self.node_to_partition))
        return self.handshake(grid, timeout, new) if new else []


def seeded_sample(ids: list[int], fraction: float, minimum: int, seed: int, purpose: str,
                  server_round: int) -> list[int]:
    """round(fraction * len(ids)) of the ids (at least `minimum`, at most all), chosen by (seed, purpose, round)."""
    k = min(len(ids), max(minimum, int(round(fraction * len(ids)))))
    if k == len(ids):
        return sorted(ids)
    rng = np.random.default_rng(derive_seed(seed, purpose, server_round))
    return sorted(rng.choice(sorted(ids), size=k, replace=False).tolist())
