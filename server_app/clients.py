"""The federation's clients as the server knows them: the handshake that maps nodes to partitions, and seeded
sampling of partitions (independent of Flower's random node ids)."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from common.config import RunConfig
from common.methods.robust import MIN_ROBUST_MODELS, robust_needs
from common.seeding import derive_seed
from common.wire.messages import (
    CONFIG,
    METRICS,
    NUM_PARTITIONS,
    NUM_TEST,
    NUM_TRAIN,
    PARTITION_ID,
    REASON,
    REFUSED,
    SERVER_ROUND,
)
from common.wire.validation import PayloadError, printable, read_count

from .exchange import each_reply, exchange, patient
from .takeover import AfterTimeout, OperatorConsent


def refusal(msg: Message) -> str | None:
    """Why a node did not answer a handshake: Flower's error reply, or the node's own 'refused' record (its data
    cannot be made under the run's settings); printable and at most 300 characters. None for an answer."""
    if msg.has_error():
        text = str(msg.error.reason)
    elif REFUSED in msg.content.config_records:
        text = str(msg.content.config_records[REFUSED].get(REASON, "no reason given"))
    else:
        return None
    return printable(text)


FIRST_HANDSHAKE_TIMEOUT_S = 120.0  # the run's first message starts each node's ClientApp (a FAB installed, torch
# imported: tens of seconds on a loaded machine or a Raspberry Pi): a shorter round-timeout does not cut it off


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
    """Partition id -> client, and node id -> partition id.

    The first handshake fixes the federation's partitions and their sample counts for the run; each partition is
    bound to the node that claimed it first. A node that connects later may take a partition over only when its
    holder has been gone (not among the connected nodes) for `takeover_after` seconds, the `consent` allows it (by
    default: the operator, server_app/takeover.py) and it declares the partition's counts; an unknown partition id,
    or one whose holder is still there, is refused with a log line, and the node is asked again at most every
    `takeover_after` seconds. A resumed run binds each of its checkpoint's partitions to the same node again; any
    other claimant is a take-over under the same rules (its holder counts as gone since the resume), except in a
    simulation (`simulated`), where every node is the run's own and gets a new id at each start.
    """

    by_partition: dict[int, ClientInfo] = field(default_factory=dict)
    node_to_partition: dict[int, int] = field(default_factory=dict)
    max_samples: int = 100_000  # run-config max-client-samples: a larger declared count is refused
    takeover_after: float = 120.0  # run-config takeover-after (seconds)
    consent: OperatorConsent | AfterTimeout = field(default_factory=OperatorConsent)  # run-config takeover
    max_weight_ratio: float = 0.0  # run-config max-weight-ratio (0: no cap)
    clock: Callable[[], float] = time.monotonic
    last_seen: dict[int, float] = field(default_factory=dict)  # partition -> when its holder was last connected
    refused: dict[int, float] = field(default_factory=dict)  # node -> when its claim was refused
    held_out: frozenset[int] = frozenset()  # partitions that never train (run-config holdout-clients)
    expected: dict[int, ClientInfo] = field(default_factory=dict)  # a resumed run's partitions, from its checkpoint
    resumed_at: float = 0.0  # when the resumed run's registry was made (a holder before the restart is gone since)
    simulated: bool = False  # every node is the run's own (a simulation: new node ids at each start, no attacker)
    window: int = 0  # run-config messages-in-flight: handshake queries out at once (0: every node's at once)

    def add(self, info: ClientInfo) -> None:
        """Register (or replace) the client of a partition."""
        self.by_partition[info.partition_id] = info
        self.node_to_partition[info.node_id] = info.partition_id
        self.last_seen[info.partition_id] = self.clock()

    def ids(self) -> list[int]:
        """Partition ids of the clients that take part (all but the held-out ones), sorted."""
        return sorted(pid for pid in self.by_partition if pid not in self.held_out)

    def holdout_ids(self) -> list[int]:
        """Partition ids of the held-out clients (never trained, evaluated as newcomers), sorted."""
        return sorted(pid for pid in self.by_partition if pid in self.held_out)

    def hold_out(self, fraction: float, seed: int) -> None:
        """Set aside round(fraction * clients) partitions (at least 1 when fraction > 0, never all), seeded."""
        ids = sorted(self.expected or self.by_partition)  # a resumed run: all of its partitions, connected or not
        count = min(len(ids) - 1, max(1, int(round(fraction * len(ids))))) if fraction > 0 else 0
        if count <= 0:
            self.held_out = frozenset()
            return
        rng = np.random.default_rng(derive_seed(seed, "holdout-clients"))
        self.held_out = frozenset(int(pid) for pid in rng.choice(ids, size=count, replace=False))

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids())

    def __len__(self) -> int:
        return len(self.by_partition)

    def __contains__(self, partition_id: object) -> bool:
        return partition_id in self.by_partition

    def __getitem__(self, partition_id: int) -> ClientInfo:
        return self.by_partition[partition_id]

    def weight_cap(self, partition_id: int) -> float:
        """The most a client counts in a sample-weighted average: `max_weight_ratio` times the median training count
        the *other* partitions declared (inf without a cap, or with no other partition). The counts are fixed per
        partition by the first handshake, and the client's own count is not in its reference: a client that
        inflates its count gains little, and cannot raise its own cap (with two clients, it would set the median)."""
        if self.max_weight_ratio <= 0:
            return math.inf
        others = [c.num_train for pid, c in self.by_partition.items() if pid != partition_id]
        return self.max_weight_ratio * float(np.median(others)) if others else math.inf

    def total_train(self) -> int:
        """Training samples of all clients, as they declared them."""
        return sum(c.num_train for c in self.by_partition.values())

    def weighted_total(self) -> float:
        """Training samples of all clients as the weighted averages count them (each at most its `weight_cap`)."""
        return float(sum(min(c.num_train, self.weight_cap(pid)) for pid, c in self.by_partition.items()))

    def handshake(self, grid: Grid, timeout: float, node_ids: list[int] | None = None) -> list[int]:
        """Ask connected nodes (all, or the joining `node_ids`) for their partition and data sizes; keep consistent
        answers. The first handshake (no `node_ids`) gives a node up `timeout` s after the last answer of any node,
        joiners `timeout` s after their query. Returns the partitions a joining node took over."""
        joining = node_ids is not None
        connected = set(patient(grid.get_node_ids, "the connected nodes"))
        nodes = sorted(connected) if node_ids is None else sorted(node_ids)
        if not nodes:
            raise RunAborted("no SuperNode is connected")

        def queries(batch: list[int]) -> list[Message]:
            return [
                Message(
                    RecordDict({CONFIG: ConfigRecord({SERVER_ROUND: 0})}), dst_node_id=n, message_type=MessageType.QUERY
                )
                for n in batch
            ]

        sizes: set[int] = set()
        replaced: list[int] = []
        failures: Counter[str] = Counter()  # reason -> nodes: a fault every node shares is logged once
        silent: list[int] = []  # counts of queries given up unanswered
        window = self.window or len(nodes)
        replies = exchange(grid, nodes, queries, window, timeout, silent.append, renew_on_reply=not joining)
        for msg in each_reply(replies):
            node = msg.metadata.src_node_id
            why = refusal(msg)
            if why is not None:
                failures[why] += 1
                continue
            try:
                info, num_partitions = self._read_claim(node, msg.content.metric_records.get(METRICS))
                sizes.add(num_partitions)
                took_over = self._admit(info, connected, joining)
            except PayloadError as exc:
                log(WARNING, "node %s: handshake rejected: %s", node, exc)
                self.refused[node] = self.clock()
                continue
            if took_over:
                replaced.append(info.partition_id)
        if not joining and not self.by_partition:
            reasons = [failures.most_common(1)[0][0]] if failures else []
            reasons += [f"{sum(silent)} node(s) did not answer within {timeout:g} s"] if silent else []
            why = ": " + "; ".join(reasons) if reasons else " (see the warnings above)"
            raise RunAborted(f"no client answered the handshake{why}")
        for reason, count in failures.items():
            log(WARNING, "%d node(s) failed the handshake: %s", count, reason)
        if joining:
            return replaced
        if len(sizes) > 1:
            log(WARNING, "clients disagree on num-partitions: %s", sorted(sizes))
        withheld = all(c.num_train == 1 for c in self.by_partition.values())  # local DP's or SecAgg+'s fixed 1
        samples = "sample counts withheld" if withheld else f"{self.total_train():.0f} training samples in all"
        log(INFO, "handshake: %d of %d nodes ready, %s", len(self), len(nodes), samples)
        return replaced

    def _read_claim(self, node: int, metrics: Any) -> tuple[ClientInfo, int]:
        """The partition and sizes a node declares (PayloadError when malformed or out of bounds)."""
        pid = read_count(metrics, PARTITION_ID, allow_zero=True)
        num_partitions = read_count(metrics, NUM_PARTITIONS)
        info = ClientInfo(pid, node, read_count(metrics, NUM_TRAIN), read_count(metrics, NUM_TEST))
        if pid >= num_partitions:
            raise PayloadError(f"claims partition {pid} of {num_partitions}")
        if max(info.num_train, info.num_test) > self.max_samples:
            raise PayloadError(
                f"declares {info.num_train} training and {info.num_test} test samples, above "
                f"max-client-samples = {self.max_samples}"
            )
        return info, num_partitions

    def _admit(self, info: ClientInfo, connected: set[int], joining: bool) -> bool:
        """Bind the claimed partition to the node, or raise PayloadError saying why not; True for a take-over."""
        pid, node = info.partition_id, info.node_id
        if pid not in self and pid in self.expected:  # resuming: the checkpoint fixed the partition and its holder
            return self._admit_resumed(info, connected)
        if pid not in self:
            if joining or self.expected:
                known = len(self.expected) if self.expected else len(self)
                raise PayloadError(
                    f"claims partition {pid}, which is not one of the {known} partitions of this "
                    "run (fixed by the first handshake)"
                )
            self.add(info)
            return False
        holder = self[pid].node_id
        if holder == node:
            return False
        if not joining or holder in connected:
            raise PayloadError(f"claims partition {pid}, held by node {holder}, which is connected")
        first = self[pid]
        if (info.num_train, info.num_test) != (first.num_train, first.num_test):
            raise PayloadError(
                f"claims partition {pid} with {info.num_train} training and {info.num_test} test samples; it was "
                f"declared with {first.num_train} and {first.num_test} at the first handshake (fixed for the run)"
            )
        gone = self.clock() - self.last_seen.get(pid, -math.inf)
        self._check_takeover(pid, node, f"node {holder}", gone)
        self.node_to_partition.pop(holder, None)
        self.add(info)
        log(WARNING, "node %s took over partition %d from node %s, gone for %.0f s", node, pid, holder, gone)
        return True

    def _admit_resumed(self, info: ClientInfo, connected: set[int]) -> bool:
        """A resumed run's claim on one of its checkpoint's partitions: the counts must be the checkpoint's, and a
        claimant other than the holder before the restart is a take-over (its holder gone `takeover_after` seconds
        since the resume, and the consent), except in a simulation, whose nodes get new ids at every start and are
        all the run's own. True for a take-over."""
        pid, node, before = info.partition_id, info.node_id, self.expected[info.partition_id]
        if (info.num_train, info.num_test) != (before.num_train, before.num_test):
            raise PayloadError(
                f"claims partition {pid} with {info.num_train} training and {info.num_test} test "
                f"samples; the run being resumed fixed {before.num_train} and {before.num_test}"
            )
        if before.node_id != node and before.node_id in connected:
            raise PayloadError(
                f"claims partition {pid}, held by node {before.node_id} before the restart, which is connected"
            )
        if before.node_id == node or self.simulated:
            self.add(info)
            return False
        gone = self.clock() - self.resumed_at
        self._check_takeover(pid, node, f"node {before.node_id} before the restart", gone, since=" since the resume")
        self.add(info)
        log(
            WARNING,
            "node %s took over partition %d from node %s (its holder before the restart)",
            node,
            pid,
            before.node_id,
        )
        return True

    def _check_takeover(self, pid: int, node: int, holder: str, gone: float, since: str = "") -> None:
        """PayloadError unless a take-over of `pid` by `node` may happen now: its holder gone `takeover_after`
        seconds and the consent given (asked last: an operator's consent is used up only by a take-over)."""
        if gone < self.takeover_after:
            raise PayloadError(
                f"claims partition {pid}, held by {holder}, which has been gone for {gone:.0f} s{since}; "
                f"a take-over needs {self.takeover_after:g} s (run-config takeover-after)"
            )
        if not self.consent.allows(pid, node):
            raise PayloadError(
                f"claims partition {pid}, held by {holder}, which has been gone for {gone:.0f} s{since}; a take-over "
                f"needs {self.consent.how(pid, node)}"
            )

    def start(self, grid: Grid, cfg: RunConfig, resumed: dict[int, tuple[int, int, int]] | None = None) -> list[int]:
        """The run's first handshake (a resumed run: only its checkpoint's partitions and counts), the held-out
        clients set aside; RunAborted when a robust rule or secure aggregation cannot work with the clients a round
        trains. Returns the partitions another node took over from their holders before a resume."""
        if resumed is not None:
            self.expect(resumed)
        replaced = self.handshake(grid, max(cfg.round_timeout, FIRST_HANDSHAKE_TIMEOUT_S))
        self.hold_out(cfg.holdout_clients, cfg.seed)
        per_round = sample_size(len(self.ids()), cfg.fraction_train, cfg.min_train_clients)
        if cfg.robust_aggregation != "none" and per_round < MIN_ROBUST_MODELS:
            raise RunAborted(robust_needs(cfg.robust_aggregation, per_round))
        if cfg.secagg != "none":
            try:  # else every round would keep its model: a run that trains nothing
                cfg.secagg_params.for_cohort(per_round)
            except ValueError as exc:
                raise RunAborted(
                    f"{exc}: this run trains {per_round} of {len(self.ids())} clients a round (more clients, a larger "
                    "fraction-train or min-train-clients, or other secagg-* settings)"
                ) from None
        if cfg.dp == "distributed" and cfg.dp_colluding_clients >= per_round:
            raise RunAborted(
                f"dp-colluding-clients {cfg.dp_colluding_clients} leaves no client of a round of {per_round} whose "
                "noise can be counted on (more clients a round, or fewer colluding clients)"
            )
        return replaced

    def expect(self, clients: dict[int, tuple[int, int, int]]) -> None:
        """A resumed run: only the checkpoint's partitions, with their counts, may be claimed (partition -> (node,
        training samples, test samples))."""
        self.expected = {pid: ClientInfo(pid, node, train, test) for pid, (node, train, test) in clients.items()}
        self.resumed_at = self.clock()

    def table(self) -> dict[int, tuple[int, int, int]]:
        """Partition -> (node, training samples, test samples): what a checkpoint keeps of the registry."""
        return {pid: (c.node_id, c.num_train, c.num_test) for pid, c in self.by_partition.items()}

    def refresh(self, grid: Grid, timeout: float) -> list[int]:
        """Note which holders are connected; handshake nodes that connected since the last round (new or restarted
        SuperNodes; a refused one again after `takeover_after` s). Returns the partitions taken over."""
        now, connected = self.clock(), set(patient(grid.get_node_ids, "the connected nodes"))
        for pid, info in self.by_partition.items():
            if info.node_id in connected:
                self.last_seen[pid] = now
        new = sorted(
            node
            for node in connected - set(self.node_to_partition)
            if now - self.refused.get(node, -math.inf) >= self.takeover_after
        )
        return self.handshake(grid, timeout, new) if new else []


def sample_size(num_ids: int, fraction: float, minimum: int) -> int:
    """How many of `num_ids` a round samples: round(fraction * num_ids), at least `minimum`, at most all."""
    return min(num_ids, max(minimum, int(round(fraction * num_ids))))


def seeded_sample(
    ids: list[int], fraction: float, minimum: int, seed: int, purpose: str, server_round: int
) -> list[int]:
    """round(fraction * len(ids)) of the ids (at least `minimum`, at most all), chosen by (seed, purpose, round)."""
    k = sample_size(len(ids), fraction, minimum)
    if k == len(ids):
        return sorted(ids)
    rng = np.random.default_rng(derive_seed(seed, purpose, server_round))
    return sorted(rng.choice(sorted(ids), size=k, replace=False).tolist())
