"""The project's base Strategy: handshake, seeded sampling, per-client messages, reply checks, metrics, rounds."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.supercore import log

from common.aggregate import mean_std, weighted_average
from common.config import RunConfig
from common.evaluate import shift_key
from common.records import to_record
from common.seeding import derive_seed
from common.stages import STAGE_KEYS, summarize_stages

from common.validation import PayloadError, read_count, read_finite, read_fraction, validate_arrays

from ..checkpoint import Checkpoint, save_checkpoint
from ..results import ResultsWriter
from ..wire import wire_bytes


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
class TrainReply:
    """A validated training reply."""

    partition_id: int
    num_examples: int
    loss: float
    arrays: list[np.ndarray] | None
    content: RecordDict
    payload: Any = None  # algorithm-specific decoded upload (e.g. sparse weights and masks)
    stages: dict[str, float] = field(default_factory=dict)  # FLIU stage accuracies, when reported


@dataclass
class RoundLog:
    """Counters of one round, filled as it goes."""

    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("train_down", "train_up", "eval_down", "eval_up"), 0))
    per_client_bytes: dict[int, dict[str, int]] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] | None = None

    def add_bytes(self, kind: str, partition_id: int, num_bytes: int) -> None:
        """Count bytes of one message, in total and for its client."""
        self.bytes[kind] += num_bytes
        per = self.per_client_bytes.setdefault(partition_id, {"down": 0, "up": 0})
        per["down" if kind.endswith("down") else "up"] += num_bytes


class PFLStrategy(Strategy):
    """Base of every algorithm's server half. Subclasses override the payload and aggregation hooks.

    Hooks: `train_content` / `eval_content` build one client's message content; `aggregate` folds the
    validated replies into the server state. `uploads_weights` says whether train replies carry arrays.
    """

    name: ClassVar[str] = "base"
    uploads_weights: ClassVar[bool] = True
    sends_weights_for_eval: ClassVar[bool] = True
    extra_config: ClassVar[dict[str, Any]] = {}

    def __init__(self, cfg: RunConfig, initial_arrays: list[np.ndarray], specs: list[tuple[str, tuple[int, ...]]],
                 writer: ResultsWriter | None = None, prunable: list[str] | tuple[str, ...] = ()) -> None:
        self.cfg = cfg
        self.specs = specs
        self.prunable = list(prunable)
        self.global_arrays = initial_arrays
        self.writer = writer
        self.clients: dict[int, ClientInfo] = {}
        self.node_to_partition: dict[int, int] = {}
        self.round_log = RoundLog()
        self._size_cache: dict[str, int] = {}
        self.state_key = ""  # names the clients' state dirs for this run (the run folder's name)
        self.checkpoint_round = 0  # last round whose checkpoint was written
        self.resume_from: Checkpoint | None = None
        self.resumes: list[int] = []  # rounds after which earlier runs of this folder stopped and were resumed
        self._late: set[int] = set()  # simulated stragglers of the training round in progress

    # ----- hooks ---------------------------------------------------------------------------------
    def round_config(self, server_round: int, partition_id: int) -> ConfigRecord:
        """Instructions sent with every message of a round (and what clients need to keep their state on disk)."""
        config = ConfigRecord({"server-round": server_round, "partition-id": partition_id})
        if self.state_key:
            config["state-key"] = self.state_key
        if self.cfg.checkpoint_every > 0:
            config["checkpoint-round"] = self.checkpoint_round
        return config

    def global_record(self) -> ArrayRecord:
        """The current global model as one ArrayRecord (named like the model's state dict)."""
        return to_record([name for name, _ in self.specs], self.global_arrays)

    def train_content(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """Content of one client's training message (default: the global model)."""
        return RecordDict({"arrays": shared["global"], "config": self.round_config(server_round, partition_id)})

    def eval_content(self, server_round: int, partition_id: int, shared: dict[str, Any]) -> RecordDict:
        """Content of one client's evaluation message (default: the global model)."""
        content = RecordDict({"config": self.round_config(server_round, partition_id)})
        if self.sends_weights_for_eval:
            content["arrays"] = shared["global"]
        return content

    def shared_payload(self, server_round: int) -> dict[str, Any]:
        """Objects built once per round and shared by every client's message (never mutated)."""
        return {"global": self.global_record()}

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """Fold validated replies into the server state (default: sample-weighted average, FedAvg)."""
        self.global_arrays = weighted_average([r.arrays for r in replies], [r.num_examples for r in replies])

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to go on exactly as this one would (arrays and JSON values)."""
        return {"global": list(self.global_arrays)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (shapes checked against the model)."""
        arrays = [np.asarray(a, dtype=np.float32) for a in state["global"]]
        if [a.shape for a in arrays] != [tuple(shape) for _, shape in self.specs]:
            raise ValueError("checkpoint's global model does not match the configured model")
        self.global_arrays = arrays

    def on_client_replaced(self, partition_id: int) -> None:
        """A new node took over a partition (e.g. a restarted SuperNode); default: nothing to forget."""

    # ----- Flower Strategy interface ---------------------------------------------------------------
    def summary(self) -> None:
        """Log the strategy's settings."""
        cfg = self.cfg
        log(INFO, "%s: %d clients, %.0f%% per round, %d rounds, %d local epochs, lr %g",
            self.name, len(self.clients), 100 * cfg.fraction_train, cfg.num_rounds, cfg.local_epochs, cfg.lr)

    def sample(self, server_round: int) -> list[int]:
        """Seeded choice of this round's training clients (partition ids), independent of node ids."""
        available = sorted(self.clients)
        k = max(self.cfg.min_train_clients, int(round(self.cfg.fraction_train * len(available))))
        k = min(k, len(available))
        rng = np.random.default_rng(derive_seed(self.cfg.seed, "sample", server_round))
        return sorted(rng.choice(available, size=k, replace=False).tolist())

    def eval_clients(self, server_round: int) -> list[int]:
        """Clients evaluated this round (all by default; a seeded fraction otherwise)."""
        available = sorted(self.clients)
        k = min(len(available), max(1, int(round(self.cfg.fraction_evaluate * len(available)))))
        if k == len(available):
            return available
        rng = np.random.default_rng(derive_seed(self.cfg.seed, "eval-sample", server_round))
        return sorted(rng.choice(available, size=k, replace=False).tolist())

    def simulated_faults(self, server_round: int, candidates: list[int], count: int, purpose: str) -> set[int]:
        """A seeded choice of `count` of the candidate training clients (simulated drops or stragglers)."""
        if count <= 0 or not candidates:
            return set()
        rng = np.random.default_rng(derive_seed(self.cfg.seed, purpose, server_round))
        return {int(pid) for pid in rng.choice(sorted(candidates), size=min(count, len(candidates)), replace=False)}

    def message_contents(self, server_round: int, partition_ids: list[int], message_type: str) -> list[RecordDict]:
        """Each client's message content. Of a round's k training clients, round(drop-rate * k) are told to fail,
        and the replies of round(straggler-rate * k) others will count as late (simulation only).

        A simulated straggler trains as usual (its local state moves on, as a real one's does) and its reply is
        set aside as if it came after the round timeout; simulated clients never sleep, since a sleeping client
        would hold one of the simulation's few workers and delay the others.
        """
        shared = self.shared_payload(server_round)
        is_train = message_type == MessageType.TRAIN
        build = self.train_content if is_train else self.eval_content
        drops: set[int] = set()
        late: set[int] = set()
        if is_train:
            k = len(partition_ids)
            drops = self.simulated_faults(server_round, partition_ids, int(round(self.cfg.drop_rate * k)), "drop")
            late = self.simulated_faults(server_round, [p for p in partition_ids if p not in drops],
                                         int(round(self.cfg.straggler_rate * k)), "straggler")
            self._late = late
        if drops:
            self.round_log.train["dropped"] = sorted(drops)
        if late:
            self.round_log.train["stragglers"] = sorted(late)
        contents = []
        for pid in partition_ids:
            content = build(server_round, pid, shared)
            if pid in drops:
                content.config_records["config"]["simulate-drop"] = True
            contents.append(content)
        return contents

    def _messages(self, server_round: int, partition_ids: list[int], message_type: str, kind: str) -> list[Message]:
        messages = []
        for pid, content in zip(partition_ids, self.message_contents(server_round, partition_ids, message_type)):
            msg = Message(content=content, dst_node_id=self.clients[pid].node_id, message_type=message_type)
            self.round_log.add_bytes(kind, pid, wire_bytes(msg, self._size_cache))
            messages.append(msg)
        return messages

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """One training message per sampled client."""
        return self._messages(server_round, self.sample(server_round), MessageType.TRAIN, "train_down")

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """One evaluation message per evaluated client."""
        return self._messages(server_round, self.eval_clients(server_round), MessageType.EVALUATE, "eval_down")

    def _sort_replies(self, replies: Iterable[Message], kind: str) -> tuple[list[tuple[int, Message]], int]:
        """Known, error-free replies in partition order, and the count of failed ones (each logged)."""
        good, failed = [], 0
        for msg in replies:
            node = msg.metadata.src_node_id
            pid = self.node_to_partition.get(node)
            if pid is None:
                if msg.has_error():  # the SuperLink answers for a node it could not reach
                    log(WARNING, "a message was not answered: %s", msg.error.reason)
                else:
                    log(WARNING, "reply from unknown node %s ignored", node)
                failed += 1
                continue
            if kind == "train_up" and pid in self._late and not msg.has_error():
                log(INFO, "client %d: reply came after the round timeout (simulated straggler), not used", pid)
                self.round_log.train["late"] = self.round_log.train.get("late", 0) + 1
                continue
            self.on_client_reply(pid, not msg.has_error())
            if msg.has_error():
                log(WARNING, "client %d (node %s) failed: %s", pid, node, msg.error.reason)
                failed += 1
                continue
            self.round_log.add_bytes(kind, pid, wire_bytes(msg, self._size_cache))
            good.append((pid, msg))
        good.sort(key=lambda item: item[0])
        return good, failed

    def on_client_reply(self, partition_id: int, ok: bool) -> None:
        """Called for every reply from a known client, failed or not (default: nothing)."""

    def _parse_metrics(self, partition_id: int, content: RecordDict) -> TrainReply:
        metrics = content.metric_records.get("metrics")
        reply = TrainReply(partition_id, read_count(metrics, "num-examples"), read_finite(metrics, "train-loss"),
                           None, content)
        reply.stages = {key: read_fraction(metrics, key) for key in STAGE_KEYS if key in metrics}
        return reply

    def parse_train_reply(self, partition_id: int, content: RecordDict) -> TrainReply:
        """Validate one training reply; raise PayloadError with the reason if it must not be used."""
        reply = self._parse_metrics(partition_id, content)
        if self.uploads_weights:
            reply.arrays = validate_arrays(content.array_records.get("arrays"), self.specs)
        return reply

    def accept_train_replies(self, replies: list[Message], what: str = "training") -> tuple[list[TrainReply], int, int]:
        """The validated training replies, and the counts of failed and rejected ones (each logged)."""
        good, failed = self._sort_replies(replies, "train_up")
        accepted: list[TrainReply] = []
        rejected = 0
        for pid, msg in good:
            try:
                accepted.append(self.parse_train_reply(pid, msg.content))
            except PayloadError as exc:
                rejected += 1
                log(WARNING, "client %d: %s reply rejected: %s", pid, what, exc)
        return accepted, failed, rejected

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, aggregate the accepted ones, record the counts."""
        replies = list(replies)
        accepted, failed, rejected = self.accept_train_replies(replies)
        if accepted:
            self.aggregate(server_round, accepted)
        flops = sum(reply_flops(r.content) for r in accepted)
        total = sum(r.num_examples for r in accepted)
        loss = sum(r.loss * r.num_examples for r in accepted) / total if total else float("nan")
        self.round_log.train.update(received=len(replies), failed=failed, rejected=rejected, used=len(accepted),
                                    loss=loss, num_examples=total, flops=flops,
                                    clients=[r.partition_id for r in accepted])
        stage_rows = [r.stages for r in accepted if r.stages]
        if stage_rows:
            self.round_log.train["stages"] = summarize_stages(stage_rows, self.cfg.rho_eps)
        return None, MetricRecord({"train-loss": loss if accepted else 0.0, "used": len(accepted)})

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Per-client accuracies at every shift degree; mean and std across clients."""
        good, failed = self._sort_replies(replies, "eval_up")
        keys = [shift_key(d) for d in self.cfg.shift_degrees]
        per_client: dict[int, dict[str, float]] = {}
        for pid, msg in good:
            metrics = msg.content.metric_records.get("metrics")
            try:
                read_count(metrics, "num-test")
                row = {key: read_fraction(metrics, key) for key in keys}
                row["loss"] = read_finite(metrics, "loss")
                row.update(self.extra_eval_metrics(metrics))
            except PayloadError as exc:
                log(WARNING, "client %d: evaluation reply rejected: %s", pid, exc)
                failed += 1
                continue
            per_client[pid] = row
        if not per_client:
            self.round_log.eval = None
            return None
        names = sorted({name for row in per_client.values() for name in row})
        stats = {name: mean_std([row.get(name, float("nan")) for row in per_client.values()]) for name in names}
        self.round_log.eval = {
            "num_clients": len(per_client), "failed": failed,
            "mean": {name: s[0] for name, s in stats.items()}, "std": {name: s[1] for name, s in stats.items()},
            "per_client": {str(pid): row for pid, row in per_client.items()},
        }
        return MetricRecord({name: s[0] for name, s in stats.items() if np.isfinite(s[0])})

    def extra_eval_metrics(self, metrics: MetricRecord | None) -> dict[str, float]:
        """Algorithm-specific evaluation metrics to keep (validated); none by default."""
        return {}

    # ----- the run ---------------------------------------------------------------------------------
    def handshake(self, grid: Grid, node_ids: list[int] | None = None) -> None:
        """Ask connected nodes (all, or `node_ids`) for their partition and data sizes; keep consistent answers.

        A node that joins later and claims a partition already held takes it over (a device replaced, or a
        SuperNode started with another key); in the first handshake the first claimant keeps it.
        """
        joining = node_ids is not None
        node_ids = sorted(grid.get_node_ids()) if node_ids is None else sorted(node_ids)
        if not node_ids:
            raise RunAborted("no SuperNode is connected")
        messages = [Message(content=RecordDict({"config": ConfigRecord({"server-round": 0})}), dst_node_id=node,
                            message_type=MessageType.QUERY) for node in node_ids]
        replies = grid.send_and_receive(messages, timeout=self.cfg.round_timeout)
        sizes: set[int] = set()
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error():
                log(WARNING, "node %s failed the handshake: %s", node, msg.error.reason)
                continue
            metrics = msg.content.metric_records.get("metrics")
            try:
                pid = read_count(metrics, "partition-id", allow_zero=True)
                info = ClientInfo(pid, node, read_count(metrics, "num-train"), read_count(metrics, "num-test"))
                sizes.add(read_count(metrics, "num-partitions"))
            except PayloadError as exc:
                log(WARNING, "node %s: handshake rejected: %s", node, exc)
                continue
            if pid in self.clients and not joining:
                log(WARNING, "node %s claims partition %d, already held by node %s: ignored",
                    node, pid, self.clients[pid].node_id)
                continue
            if pid in self.clients:
                old = self.clients[pid].node_id
                self.node_to_partition.pop(old, None)
                self.on_client_replaced(pid)
                log(INFO, "node %s took over partition %d from node %s", node, pid, old)
            elif joining:
                log(INFO, "node %s joined with partition %d", node, pid)
            self.clients[pid] = info
            self.node_to_partition[node] = pid
        if joining:
            return
        if not self.clients:
            raise RunAborted("no client answered the handshake (see the warnings above)")
        if len(sizes) > 1:
            log(WARNING, "clients disagree on num-partitions: %s", sorted(sizes))
        log(INFO, "handshake: %d of %d nodes ready, %d training samples in all",
            len(self.clients), len(node_ids), sum(c.num_train for c in self.clients.values()))

    def should_evaluate(self, server_round: int) -> bool:
        """Evaluate every `eval-every` rounds and after the last one."""
        every = self.cfg.eval_every
        return every > 0 and (server_round % every == 0 or server_round == self.cfg.num_rounds)

    def refresh_nodes(self, grid: Grid) -> None:
        """Handshake nodes that connected since the last round (new or restarted SuperNodes)."""
        new = sorted(set(grid.get_node_ids()) - set(self.node_to_partition))
        if new:
            self.handshake(grid, new)

    def restore(self, checkpoint: Checkpoint) -> None:
        """Take the state and records of a checkpoint; the run goes on after its round."""
        try:
            self.load_state_dict(checkpoint.state)
        except (ValueError, KeyError, TypeError) as exc:
            raise RunAborted(f"cannot resume from the checkpoint: {exc}") from None
        self.checkpoint_round = checkpoint.round
        self.resumes = [*checkpoint.resumes, checkpoint.round]
        if self.writer is not None:
            self.writer.restart_from(checkpoint.records)
        log(INFO, "resumed after round %d of %d (checkpoint of %s)", checkpoint.round, self.cfg.num_rounds,
            self.writer.run_dir if self.writer else "?")

    def write_checkpoint(self, server_round: int, elapsed: float) -> None:
        """After every `checkpoint-every` rounds and the last one: the state needed to resume, atomically."""
        every = self.cfg.checkpoint_every
        if self.writer is None or every <= 0 or (server_round % every and server_round != self.cfg.num_rounds):
            return
        save_checkpoint(self.writer.run_dir, Checkpoint(server_round, self.state_dict(), self.writer.records,
                                                        elapsed, self.resumes))
        self.checkpoint_round = server_round

    def run(self, grid: Grid) -> None:
        """Handshake, then the rounds: train, aggregate, evaluate, record, checkpoint, log progress with ETA."""
        self.handshake(grid)
        first = 1
        elapsed_before = 0.0
        if self.resume_from is not None:
            self.restore(self.resume_from)
            first, elapsed_before = self.resume_from.round + 1, self.resume_from.elapsed_s
        self.summary()
        start = time.monotonic() - elapsed_before
        empty_arrays, empty_config = ArrayRecord(), ConfigRecord()
        for rnd in range(first, self.cfg.num_rounds + 1):
            t0 = time.monotonic()
            self.round_log = RoundLog()
            self._size_cache = {}
            if rnd > first:
                self.refresh_nodes(grid)
            if rnd == 1:
                self.before_first_round(grid)
            messages = list(self.configure_train(rnd, empty_arrays, empty_config, grid))
            replies = grid.send_and_receive(messages, timeout=self.cfg.round_timeout) if messages else []
            self.aggregate_train(rnd, replies)
            self.round_log.train["sent"] = len(messages)
            if self.should_evaluate(rnd):
                eval_messages = list(self.configure_evaluate(rnd, empty_arrays, empty_config, grid))
                self.aggregate_evaluate(rnd, grid.send_and_receive(eval_messages, timeout=self.cfg.round_timeout))
            wall = time.monotonic() - t0
            elapsed = time.monotonic() - start
            record = {"round": rnd, "wall_s": wall, "elapsed_s": elapsed, "train": self.round_log.train,
                      "bytes": self.round_log.bytes,
                      "bytes_per_client": {str(k): v for k, v in sorted(self.round_log.per_client_bytes.items())},
                      "eval": self.round_log.eval}
            record.update(self.extra_round_record(rnd))
            if self.writer is not None:
                self.writer.add_round(record)
            self.write_checkpoint(rnd, elapsed)
            self._log_progress(rnd, record, elapsed)

    def before_first_round(self, grid: Grid) -> None:
        """Work before round 1 whose traffic counts in round 1 (e.g. FedAMP's local pre-training); none here."""

    def extra_round_record(self, server_round: int) -> dict[str, Any]:
        """Algorithm-specific fields for metrics.jsonl; none by default."""
        return {}

    def _log_progress(self, rnd: int, record: dict[str, Any], elapsed: float) -> None:
        total = self.cfg.num_rounds
        eta = elapsed / rnd * (total - rnd)
        train = record["train"]
        text = (f"[round {rnd}/{total}] train {train['used']}/{train['sent']} used, loss {train['loss']:.4f}"
                f" | down {record['bytes']['train_down'] / 1e6:.2f} MB up {record['bytes']['train_up'] / 1e6:.2f} MB")
        if record["eval"]:
            mean, std = record["eval"]["mean"], record["eval"]["std"]
            k0, k1 = shift_key(min(self.cfg.shift_degrees)), shift_key(max(self.cfg.shift_degrees))
            text += (f" | acc {100 * mean[k0]:.2f}+/-{100 * std[k0]:.2f}%"
                     f" (shift {100 * max(self.cfg.shift_degrees):g}%: {100 * mean[k1]:.2f}%)")
        text += f" | {record['wall_s']:.1f}s, ETA {_duration(eta)}"
        log(INFO, text)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def reply_flops(content: RecordDict) -> float:
    """A reply's reported training FLOPs (0 when absent or malformed: a cost figure, never used in math)."""
    value = content.metric_records.get("metrics", {}).get("train-flops", 0.0)
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) and value >= 0 else 0.0
