"""The round runner: handshake, rounds, per-client messages and their bytes, reply checks, simulated faults,
checkpoints, progress. What an algorithm does lives in its hooks (strategies/).

It drives Flower's Grid itself and does not subclass Flower's `Strategy`: `Strategy.start()` is one fixed loop
(configure, send and wait for all, aggregate, evaluate) that has no handshake, no nodes joining or taking a
partition over mid-run, no replies checked and folded as they arrive, no windows of messages, no pre-training
round, no held-out clients and no checkpoints; a subclass whose `start()` could not run a single one of our
algorithms correctly would break that contract rather than honour it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from logging import INFO, WARNING
from typing import Any

from flwr.app import Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from common import profiling
from common.config import RunConfig, due
from common.learning.evaluate import shifted_metric_keys
from common.wire.messages import CHECKPOINT_ROUND, CONFIG, METRICS, RUN_ID, SIMULATE_DROP, STATE_KEY
from common.wire.validation import PayloadError, echo_values, printable

from .checkpoint import Checkpoint, restore, save_checkpoint
from .clients import ClientRegistry, RunAborted
from .exchange import each_reply, exchange
from .faults import plan_faults
from .limits import ReplyLimits
from .newcomers import newcomer_statistics
from .plateau import Plateau
from .replies import RoundLog, TrainReply, eval_statistics, evaluation_rows, parse_train_metrics, train_record
from .results import ResultsWriter, progress_text, round_record, settings_text
from .secure import SecureRound
from .state_versions import CHECKPOINT_KEY as VERSIONS_KEY
from .state_versions import StateVersions
from .strategies.base import PFLStrategy
from .warmup import pretrain_round


class RoundRunner:
    """Drives one algorithm's hooks through a run on Flower's Grid and records every round."""

    def __init__(
        self,
        cfg: RunConfig,
        strategy: PFLStrategy,
        clients: ClientRegistry,
        writer: ResultsWriter | None = None,
        state_key: str = "",
        resume_from: Checkpoint | None = None,
        before_checkpoint: Callable[[int | None], None] | None = None,
    ) -> None:
        self.cfg, self.strategy, self.clients, self.writer = cfg, strategy, clients, writer
        self.state_key = state_key  # names the clients' state dirs for this run (the run folder's name)
        self.run_id = ""  # a deployment's run id (server_app/checkpoint.py), sent with the state key; "" elsewhere
        self.resume_from = resume_from
        self.before_checkpoint = before_checkpoint  # e.g. the in-process engine writing the client state it keeps
        self.checkpoint_round = 0  # last round whose checkpoint was written
        self.resumes: list[int] = []  # rounds after which earlier runs of this folder stopped and were resumed
        self.round_log = RoundLog.starting(self.cfg.message_digests)
        self._late: dict[int, set[int]] = {}  # the round whose training is sent: its simulated stragglers
        self._limits = ReplyLimits.for_model(strategy.specs)
        self._expected: dict[int, dict[str, int]] = {}  # per client: the round (and phase) its reply must name
        self.plateau = Plateau(cfg.evaluation)  # `stop-patience`: the accuracy curve, and where the run stopped early
        self.state_versions = StateVersions(writer.run_dir if writer is not None else None)

    # ----- messages --------------------------------------------------------------------------------------
    @profiling.timed("build")
    def message_contents(
        self, server_round: int, partition_ids: list[int], message_type: str, newcomers: bool = False
    ) -> list[RecordDict]:
        """Each client's message content (held-out clients': the newcomer's); training clients picked by drop-rate
        are told to fail and those picked by straggler-rate will have their replies set aside as late."""
        strategy, cfg = self.strategy, self.cfg
        shared = strategy.round_payload(server_round, f"{message_type}/{'newcomers' if newcomers else 'clients'}")
        is_train = message_type == MessageType.TRAIN
        build = strategy.train_message if is_train else strategy.eval_content
        build = strategy.newcomer_content if newcomers else build
        drops: set[int] = set()
        if is_train:  # a phase sent in several batches (pre-training) adds up the faults of each
            drops, late = plan_faults(cfg.seed, server_round, partition_ids, cfg.drop_rate, cfg.straggler_rate)
            self._late = {server_round: self._late.get(server_round, set()) | late}
            for key, chosen in (("dropped", drops), ("stragglers", late)):
                if chosen:
                    self.round_log.train[key] = sorted(set(self.round_log.train.get(key, [])) | chosen)
        contents = []
        for pid in partition_ids:
            content = build(server_round, pid, shared)
            config = content.config_records[CONFIG]
            if self.state_key:
                config[STATE_KEY] = self.state_key
                if self.run_id:
                    config[RUN_ID] = self.run_id
            if cfg.checkpoint_every > 0:
                config[CHECKPOINT_ROUND] = self.checkpoint_round
            for key, value in self.state_versions.instructions(pid, self.clients[pid].node_id).items():
                config[key] = value
            if pid in drops:
                config[SIMULATE_DROP] = True
            self._expected[pid] = echo_values(config)
            contents.append(content)
        return contents

    @profiling.timed("messages")
    def messages(
        self, server_round: int, partition_ids: list[int], message_type: str, kind: str, newcomers: bool = False
    ) -> list[Message]:
        """The messages to the given clients, their bytes counted under `kind` (e.g. train_down)."""
        contents = self.message_contents(server_round, partition_ids, message_type, newcomers)
        messages = [
            Message(content=content, dst_node_id=self.clients[pid].node_id, message_type=message_type)
            for pid, content in zip(partition_ids, contents)
        ]
        for pid, msg in zip(partition_ids, messages):
            self.round_log.add_message(kind, pid, msg)
        return messages

    def send(
        self,
        grid: Grid,
        server_round: int,
        partition_ids: list[int],
        message_type: str,
        kind: str,
        newcomers: bool = False,
        window: int = 0,
    ) -> Iterator[list[Message]]:
        """One phase's exchange (server_app/exchange.py) of this runner's messages to the given clients, at most
        `window` (default `messages-in-flight`) out at once."""
        sent_as = f"{kind}/newcomers" if newcomers else kind
        return exchange(
            grid,
            partition_ids,
            lambda batch: self.messages(server_round, batch, message_type, kind, newcomers),
            window or self.cfg.messages_in_flight,
            self.cfg.round_timeout,
            lambda count: self.round_log.add_timed_out(sent_as, count),
        )

    # ----- replies ---------------------------------------------------------------------------------------
    @profiling.timed("check")
    def sort_replies(
        self, server_round: int, replies: Iterable[Message], kind: str
    ) -> tuple[list[tuple[int, Message]], int, int]:
        """Known, error-free replies of sane size in partition order, and the counts of failed and oversized ones."""
        good, failed, oversized = [], 0, 0
        for msg in replies:
            node = msg.metadata.src_node_id
            pid = self.clients.node_to_partition.get(node)
            if pid is None:
                if msg.has_error():  # the SuperLink answers for a node it could not reach
                    log(WARNING, "a message was not answered: %s", printable(str(msg.error.reason)))
                else:
                    log(WARNING, "reply from unknown node %s ignored", node)
                failed += 1
                continue
            if kind == "train_up" and pid in self._late.get(server_round, ()) and not msg.has_error():
                log(INFO, "client %d: reply came after the round timeout (simulated straggler), not used", pid)
                self.round_log.train["late"] = self.round_log.train.get("late", 0) + 1
                continue
            self.strategy.on_client_reply(server_round, pid, not msg.has_error())
            if msg.has_error():
                log(WARNING, "client %d (node %s) failed: %s", pid, node, printable(str(msg.error.reason)))
                self.state_versions.explain(pid, node, str(msg.error.reason))
                self.round_log.add_message(kind, pid, msg, 0)
                failed += 1
                continue
            try:  # before counting its bytes: that re-serializes it
                self._limits.check(msg.content, self._expected.get(pid, {}))
            except PayloadError as exc:
                log(WARNING, "client %d: reply refused before decoding: %s", pid, exc)
                oversized += 1
                continue
            self.round_log.add_message(kind, pid, msg)
            good.append((pid, msg))
        return sorted(good, key=lambda item: item[0]), failed, oversized

    def accept_train_replies(
        self, server_round: int, replies: Iterable[Message], what: str = "training"
    ) -> tuple[list[TrainReply], int, int]:
        """Validated training replies (partition order), failed and rejected counts; each checked on arrival."""
        accepted: list[TrainReply] = []
        failed = rejected = 0
        for msg in replies:  # as they arrive
            good, not_answered, oversized = self.sort_replies(server_round, [msg], "train_up")
            failed, rejected = failed + not_answered, rejected + oversized
            with profiling.timer("aggregate"):
                for pid, reply_msg in good:
                    try:
                        declared, cap = self.clients[pid].num_train, self.clients.weight_cap(pid)
                        reply = parse_train_metrics(pid, reply_msg.content, declared, cap)
                        self.strategy.decode_train_reply(server_round, reply)
                        self.state_versions.note(pid, reply_msg.content.metric_records.get(METRICS), server_round)
                        accepted.append(reply)
                    except PayloadError as exc:
                        rejected += 1
                        log(WARNING, "client %d: %s reply rejected: %s", pid, what, exc)
        return sorted(accepted, key=lambda r: r.partition_id), failed, rejected

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> None:
        """Validate replies (as they arrive), aggregate the accepted ones, record the counts."""
        accepted, failed, rejected = self.accept_train_replies(server_round, replies)
        train, started = self.round_log.train, time.perf_counter()
        self.strategy.aggregation_fields = {}  # a round that aggregates nothing reports nothing of an earlier one
        self.strategy.peer_bound = {}
        aggregates = bool(accepted) or self.strategy.releases_without_uploads(server_round)
        if aggregates:
            with profiling.timer("aggregate"):
                self.strategy.aggregate(server_round, accepted)
            self.round_log.aggregate_s = time.perf_counter() - started  # a timing: kept out of `train`
        train.update(train_record(accepted, failed, rejected, train, self.cfg.rho_eps))
        if self.cfg.privacy.withholds_metrics or self.cfg.secagg != "none":  # a fixed 0: none was reported
            train["loss"] = float("nan")
        if timed_out := self.round_log.timed_out.pop("train_down", 0):  # not received: in no count above
            train["timed_out"] = timed_out
        train.update(self.strategy.aggregation_fields if aggregates else {})
        if accepted and self.strategy.peer_bound:
            train["peer_bound"] = self.strategy.peer_bound

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> None:
        """Per-client accuracies at every shift degree (and the algorithm's extra rows); mean and std."""
        good, failed, oversized = self.sort_replies(server_round, replies, "eval_up")
        failed += self.round_log.timed_out.get("eval_down", 0)
        with profiling.timer("aggregate"):
            per_client, rejected = evaluation_rows(
                good,
                self.cfg.shift_degrees,
                lambda m: self.strategy.eval_metrics(server_round, m),
                required=shifted_metric_keys(self.cfg.evaluation),
            )
            self.round_log.eval = eval_statistics(per_client, failed + oversized + rejected) if per_client else None
        for pid, msg in good:
            if pid in per_client:
                try:
                    self.state_versions.note(pid, msg.content.metric_records.get(METRICS), server_round)
                except PayloadError as exc:
                    log(WARNING, "client %d: evaluation reply's state round ignored: %s", pid, exc)

    def pretrain(self, grid: Grid) -> None:
        """Round 0 (server_app/warmup.py): every client trains once; its counts and faults go in round 1's record."""
        clients = self.clients.ids()
        if self.cfg.secagg != "none":  # every client in one secure sum; its record goes under round 1's pretrain
            SecureRound(self, grid, 0).train(clients)
            train = self.round_log.train
            counts = ("received", "failed", "rejected", "used", "secagg")
            summed = {key: train.pop(key) for key in counts if key in train}
            for key in ("loss", "num_examples", "flops", "flops_dense_grad", "clients"):
                train.pop(key, None)
            train["pretrain"] = {"sent": len(clients), **summed}
            log(INFO, "pre-training: %d of %d clients in the secure sum", summed.get("used", 0), len(clients))
            return
        stats = pretrain_round(
            self.send(grid, 0, clients, MessageType.TRAIN, "train_down"),
            self.cfg.messages_in_flight,
            lambda replies: self.accept_train_replies(0, replies, "pre-training"),
            lambda accepted: self.strategy.aggregate(0, accepted),
        )
        train = self.round_log.train
        faults: dict[str, Any] = {"late": train.pop("late", 0)}
        faults.update((key, train.pop(key)) for key in ("dropped", "stragglers") if key in train)
        if timed_out := self.round_log.timed_out.pop("train_down", 0):
            faults["timed_out"] = timed_out
        train["pretrain"] = {"sent": len(clients), **stats, **faults}
        log(INFO, "pre-training: %d of %d clients trained from the common initialization", stats["used"], len(clients))

    def evaluate_newcomers(self, grid: Grid, server_round: int) -> None:
        """The held-out clients (server_app/newcomers.py), evaluated as newcomers: the round's `unseen` row."""
        pids = self.clients.holdout_ids()
        if pids:
            chunks = self.send(grid, server_round, pids, MessageType.EVALUATE, "eval_down", newcomers=True)
            good, failed, oversized = self.sort_replies(server_round, list(each_reply(chunks)), "eval_up")
            failed += self.round_log.timed_out.get("eval_down/newcomers", 0)
            self.round_log.unseen = newcomer_statistics(good, failed + oversized, self.cfg.evaluation)

    def train(self, grid: Grid, server_round: int) -> None:
        """The round's training: sample, send every message at once (each built from the round's starting state),
        check and fold the replies as they arrive, record the counts."""
        sampled = self.strategy.sample(server_round)
        if self.cfg.secagg != "none" and self.strategy.uploads_in_round(server_round):
            SecureRound(self, grid, server_round).train(sampled)
            self.round_log.train["sent"] = len(sampled)
            return
        window = max(len(sampled), 1)
        training = self.send(grid, server_round, sampled, MessageType.TRAIN, "train_down", window=window)
        self.aggregate_train(server_round, each_reply(training))
        self.round_log.train["sent"] = len(sampled)

    def evaluate(self, grid: Grid, server_round: int) -> None:
        """The round's evaluation: the strategy's evaluation clients, then the held-out ones as newcomers."""
        evaluation = self.send(
            grid, server_round, self.strategy.eval_clients(server_round), MessageType.EVALUATE, "eval_down"
        )
        self.aggregate_evaluate(server_round, list(each_reply(evaluation)))
        self.evaluate_newcomers(grid, server_round)

    # ----- the run ---------------------------------------------------------------------------------------
    def should_evaluate(self, server_round: int) -> bool:
        """Evaluate every `eval-every` rounds and after the last one; never while the clients withhold their
        metrics (local DP, dp-local-metrics = withhold: they would refuse)."""
        if self.cfg.privacy.withholds_metrics:
            return False
        return due(server_round, self.cfg.eval_every, self.cfg.num_rounds)

    @profiling.timed("checkpoint")
    def write_checkpoint(self, server_round: int, elapsed: float, last_round: int) -> None:
        """After every `checkpoint-every` rounds and the last one: the state to resume from, atomically, after the
        `before_checkpoint` callback (a runtime writing the client state it keeps)."""
        if self.writer is not None and due(server_round, self.cfg.checkpoint_every, last_round):
            if self.before_checkpoint is not None:
                self.before_checkpoint(self.checkpoint_round)
            state, records = self.strategy.state_dict(), self.writer.records
            state[VERSIONS_KEY] = self.state_versions.state()
            checkpoint = Checkpoint(server_round, state, records, elapsed, self.resumes, self.clients.table())
            save_checkpoint(self.writer.run_dir, checkpoint)
            self.checkpoint_round = server_round

    def run(self, grid: Grid) -> None:
        """Handshake, then the rounds: train, aggregate, evaluate, record, checkpoint, log progress with ETA."""
        replaced = self.clients.start(
            grid, self.cfg, self.resume_from.clients if self.resume_from is not None else None
        )
        first, elapsed_before = 1, 0.0
        if self.resume_from is not None:
            self.resumes = restore(self.strategy, self.writer, self.resume_from)
            try:
                self.state_versions.load(self.resume_from.state.get(VERSIONS_KEY), self.resume_from.round)
            except ValueError as exc:
                raise RunAborted(f"cannot resume from the checkpoint: {exc}") from None
            for pid in replaced:  # after the restore: the state it forgets is the checkpoint's
                self.strategy.on_client_replaced(self.resume_from.round + 1, pid)
                self.state_versions.forget(pid)
            self.checkpoint_round = self.resume_from.round
            log(INFO, "resumed after round %d of %d from its checkpoint", self.checkpoint_round, self.cfg.num_rounds)
            first, elapsed_before = self.resume_from.round + 1, self.resume_from.elapsed_s
            if self.plateau.resumed(self.writer.records if self.writer is not None else [], first - 1):
                return  # it had stopped, then died before its summary was written
        log(INFO, "%s", settings_text(self.cfg, len(self.clients)))
        if self.cfg.privacy.withholds_metrics:
            log(
                INFO,
                "local DP: the clients withhold every statistic of their data (loss, sample and step counts, FLOPs, "
                "evaluation), so the run evaluates nothing; dp-local-metrics = report has a simulation report them, "
                "without noise and outside the epsilon",
            )
        self.strategy.prepare()
        start = time.monotonic() - elapsed_before
        for rnd in range(first, self.cfg.num_rounds + 1):
            with profiling.record("server", round=rnd):
                if self.run_round(grid, rnd, rnd > first, start):
                    break

    def run_round(self, grid: Grid, rnd: int, refresh: bool, start: float) -> bool:
        """One round: handshake joiners, (warm up,) train, aggregate, evaluate, record, checkpoint; True: the last."""
        t0, timeout = time.monotonic(), self.cfg.round_timeout
        self.round_log = RoundLog.starting(self.cfg.message_digests)
        if refresh:
            for pid in self.clients.refresh(grid, timeout):
                self.strategy.on_client_replaced(rnd, pid)
                self.state_versions.forget(pid)
        if rnd == 1 and self.strategy.warmup_round():
            self.pretrain(grid)
        self.train(grid, rnd)
        if self.should_evaluate(rnd):
            started = time.monotonic()
            self.evaluate(grid, rnd)
            self.round_log.evaluate_s = time.monotonic() - started  # a timing: kept out of `eval`
        elapsed = time.monotonic() - start
        record = round_record(rnd, time.monotonic() - t0, elapsed, self.round_log, self.strategy.round_record(rnd))
        if self.writer is not None:
            self.writer.add_round(record, self.round_log.digests)
        stop = self.plateau.ends_after(rnd, record)
        self.write_checkpoint(rnd, elapsed, rnd if stop else self.cfg.num_rounds)  # a stopped run's last round
        log(INFO, "%s", progress_text(record, self.cfg.num_rounds, self.cfg.shift_degrees, elapsed))
        return stop
