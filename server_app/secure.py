"""A training round under secure aggregation (run-config `secagg` = secaggplus, common/secagg/): SecAgg+'s
stages as messages through the one exchange loop, the masked vectors summed, the masks removed, and the cohort's
weighted mean handed to the algorithm's own aggregate as one reply that holds it with the cohort's total weight
(a weighted average of that one reply is the mean itself), so every averaging strategy aggregates unchanged. The
server never holds one client's upload, sample count or loss."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping
from logging import WARNING
from typing import Any, Protocol, TypeVar

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from common.algorithms import SPECS
from common.config import RunConfig
from common.methods.distributed_dp import DP_UPDATE, RoundPlan
from common.secagg.encoding import Decoded, decode
from common.secagg.params import Cohort
from common.secagg.protocol import SecAggAborted, ServerSession
from common.secagg.wire import (
    CAPPED,
    LOSS,
    MAX_SECRET_BYTES,
    SETUP,
    SHARE,
    UNMASK,
    Fields,
    cohort_record,
    dp_layout,
    neighbours_record,
    read_keys,
    read_secrets,
    read_vector,
    routed_record,
    unmask_record,
    upload_layout,
)
from common.wire.messages import CONFIG, SECAGG, SERVER_ROUND
from common.wire.validation import PayloadError, printable

from .clients import ClientRegistry
from .exchange import each_reply, exchange
from .limits import ReplyLimits
from .replies import RoundLog
from .strategies.base import PFLStrategy


class RoundHost(Protocol):
    """What a round's secure aggregation uses of the round runner (server_app/runner.py), which hosts it."""

    cfg: RunConfig
    strategy: PFLStrategy
    clients: ClientRegistry
    round_log: RoundLog

    def messages(self, server_round: int, partition_ids: list[int], message_type: str, kind: str) -> list[Message]:
        """The runner's training messages to these clients (faults, state versions, echo expectations set)."""
        ...

    def sort_replies(
        self, server_round: int, replies: Iterable[Message], kind: str
    ) -> tuple[list[tuple[int, Message]], int, int]:
        """The runner's checks of replies: known, error-free, of sane size, naming the round."""
        ...


T = TypeVar("T")


class SecureRound:
    """One round's secure aggregation for a runner: `train` does what the runner's plain training does."""

    def __init__(self, runner: RoundHost, grid: Grid, server_round: int) -> None:
        self.runner, self.grid, self.server_round = runner, grid, server_round
        self.params = runner.cfg.secagg_params
        sections, self.masked = runner.strategy.secure_layout(server_round)
        self.names, self.sizes = [name for name, _ in sections], [size for _, size in sections]
        self.private = runner.cfg.dp == "distributed"  # the vector is the clients' noised integer updates
        self.layout = (
            dp_layout(sum(self.sizes))
            if self.private
            else upload_layout(self.names, self.sizes, self.masked, self.params.quantization_range)
        )
        self.record: dict[str, Any] = {}
        self.failed = self.rejected = 0

    def train(self, sampled: list[int]) -> None:
        """The round's training under SecAgg+: the strategy aggregates the cohort's mean, or nothing when the
        protocol cannot finish (one WARNING line; the model is kept)."""
        started = time.perf_counter()
        self.runner.strategy.aggregation_fields = {}  # a kept round reports nothing of an earlier one
        plan = None
        try:
            cohort = self.params.for_cohort(len(sampled))
            self.layout.check_cohort(len(sampled), self.params)
            if self.private:
                plan = self.runner.strategy.distributed_plan(sum(self.sizes), len(sampled))
        except ValueError as exc:
            self._kept(f"secure aggregation cannot run: {exc}", started)
            return
        seed = random.Random(f"secagg/{self.runner.cfg.seed}/{self.server_round}")
        server = ServerSession(cohort, sampled, self.layout.size, seed)
        self.record = {"cohort": cohort.num_clients, "shares": cohort.shares, "threshold": cohort.threshold}
        try:
            total = self._protocol(cohort, server)
        except SecAggAborted as exc:
            self._rejections(server)
            self._kept(str(exc), started)
            return
        self._rejections(server)
        survivors = sorted(server.survivors)
        decoded = decode(self.layout, total, len(survivors), self.params)
        if plan is not None:
            self._private(decoded, plan, survivors, server, started)
            return
        if decoded.weight_units <= 0:
            self._kept("the cohort's total sample count is 0", started)
            return
        # under equal weights every client's coordinate is max-weight: the cohort's sample count is not in the sum
        samples = 0.0 if SPECS[self.runner.cfg.algorithm].equal_weights else decoded.samples(self.params.max_weight)
        loss = float(decoded.mean(LOSS)[0])
        self.runner.strategy.aggregate_secure(self.server_round, decoded, len(survivors), loss)
        capped = int(decoded.integers[CAPPED][0])
        if capped:
            log(
                WARNING,
                "secure aggregation: %d of %d clients counted at secagg-max-weight %g samples (they hold more): "
                "raise it",
                capped,
                len(survivors),
                self.params.max_weight,
            )
        self._counted(survivors, server, started, loss, round(samples), capped=capped)

    def _private(
        self, decoded: Decoded, plan: RoundPlan, survivors: list[int], server: ServerSession, started: float
    ) -> None:
        """Distributed DP's round: the strategy folds in the mean update of the exact integer sum; no loss or
        sample count travels (the round record says withheld)."""
        if decoded.weight_units != len(survivors):
            self._kept(f"the sum counts {decoded.weight_units} clients, {len(survivors)} sent vectors", started)
            return
        self.runner.strategy.aggregate_distributed(self.server_round, decoded.integers[DP_UPDATE], plan, survivors)
        self._counted(survivors, server, started, float("nan"), 0)

    def _counted(
        self,
        survivors: list[int],
        server: ServerSession,
        started: float,
        loss: float,
        num_examples: int,
        **secagg: Any,
    ) -> None:
        """The round record of a sum the strategy folded in: who was in it and what the protocol cost."""
        self.record.update(survivors=len(survivors), dropped_after_sharing=len(server.shared) - len(survivors))
        self.record.update(**secagg, seconds=round(time.perf_counter() - started, 3))
        self.runner.round_log.train.update(
            {
                "received": len(survivors) + self.failed + self.rejected,
                "failed": self.failed,
                "rejected": self.rejected,
                "used": len(survivors),
                "loss": loss,
                "num_examples": num_examples,
                "flops": 0.0,
                "flops_dense_grad": 0.0,
                "clients": survivors,
                "secagg": self.record,
                **self.runner.strategy.aggregation_fields,
            }
        )

    def _protocol(self, cohort: Cohort, server: ServerSession) -> np.ndarray:
        keys = self._stage(SETUP, list(server.neighbours), lambda pid: cohort_record(cohort), read_keys, cohort)
        requests = server.share_requests(keys)
        shared = self._stage(
            SHARE, sorted(requests), lambda pid: neighbours_record(requests[pid]), read_secrets, cohort
        )
        routed = server.masked_requests(shared)
        vectors = self._masked(routed)
        asks = server.unmask_requests(vectors)
        shares = self._stage(UNMASK, sorted(asks), lambda pid: unmask_record(*asks[pid]), read_secrets, cohort)
        return server.finish(shares)

    def _kept(self, why: str, started: float) -> None:
        log(WARNING, "round %d: %s; the model is kept", self.server_round, why)
        self.record.update(aborted=why, seconds=round(time.perf_counter() - started, 3))
        self.runner.round_log.train.update(
            {"received": self.failed + self.rejected, "failed": self.failed, "rejected": self.rejected, "used": 0}
        )
        self.runner.round_log.train.update(loss=float("nan"), num_examples=0, clients=[], secagg=self.record)

    def _rejections(self, server: ServerSession) -> None:
        for line in server.rejected:
            log(WARNING, "secure aggregation, round %d: %s left out", self.server_round, line)
        self.rejected += len(server.rejected)

    def _stage(
        self,
        action: str,
        pids: list[int],
        content: Callable[[int], Fields],
        read: Callable[[Mapping[str, ConfigRecord]], T],
        cohort: Cohort,
    ) -> dict[int, T]:
        """One key, share or unmask stage: a message to each client, its answer read and checked."""
        runner, round_log = self.runner, self.runner.round_log
        limits = ReplyLimits(0, 0, config_entries=2 * cohort.shares + 8, config_bytes=cohort.shares * MAX_SECRET_BYTES)

        def build(batch: list[int]) -> list[Message]:
            messages = []
            for pid in batch:
                records = RecordDict(
                    {CONFIG: ConfigRecord({SERVER_ROUND: self.server_round}), SECAGG: ConfigRecord(content(pid))}
                )
                msg = Message(content=records, dst_node_id=runner.clients[pid].node_id, message_type=action)
                round_log.add_message("train_down", pid, msg)
                messages.append(msg)
            return messages

        out: dict[int, T] = {}
        cfg = runner.cfg
        chunks = exchange(self.grid, pids, build, len(pids), cfg.round_timeout, self._given_up)
        for msg in each_reply(chunks):
            pid = runner.clients.node_to_partition.get(msg.metadata.src_node_id)
            if pid is None or pid not in pids:
                continue
            if msg.has_error():
                log(
                    WARNING,
                    "client %d: secure aggregation stage %s failed: %s",
                    pid,
                    action,
                    printable(str(msg.error.reason)),
                )
                self.failed += 1
                continue
            try:
                limits.check(msg.content, {SERVER_ROUND: self.server_round})
                round_log.add_message("train_up", pid, msg)
                out[pid] = read(msg.content.config_records)
            except PayloadError as exc:
                log(WARNING, "client %d: secure aggregation stage %s answer refused: %s", pid, action, exc)
                self.rejected += 1
        return out

    def _masked(self, routed: dict[int, dict[int, bytes]]) -> dict[int, np.ndarray]:
        """Stage 2 on the round's train messages: each carries the shares routed to its client and the upload's
        layout; each answer is the masked vector (the runner's reply checks first: size, round echo, errors)."""
        runner, pids = self.runner, sorted(routed)

        def build(batch: list[int]) -> list[Message]:
            messages = runner.messages(self.server_round, batch, MessageType.TRAIN, "train_down")
            for pid, msg in zip(batch, messages, strict=True):
                msg.content[SECAGG] = ConfigRecord(routed_record(routed[pid], self.names, self.sizes, self.masked))
            return messages

        out: dict[int, np.ndarray] = {}
        chunks = exchange(self.grid, pids, build, len(pids), runner.cfg.round_timeout, self._given_up)
        for msg in each_reply(chunks):
            good, failed, oversized = runner.sort_replies(self.server_round, [msg], "train_up")
            self.failed, self.rejected = self.failed + failed, self.rejected + oversized
            for pid, reply in good:
                try:
                    out[pid] = read_vector(reply.content.array_records, self.layout.size, self.params.modulus_range)
                except PayloadError as exc:
                    log(WARNING, "client %d: masked vector refused: %s", pid, exc)
                    self.rejected += 1
        return out

    def _given_up(self, count: int) -> None:
        self.failed += count
