"""Stand-ins for Flower reply messages, so strategies can be tested in-process without a running app."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import ArrayRecord, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode
from flwr.supercore.task_identity import TaskIdentity

from common.wire.records import to_record


def FakeReply(node_id: int, content: RecordDict | None = None, error: str | None = None) -> Message:
    """A real reply Message from node `node_id`: `content`, or an error with `error` as its reason (as the runtime
    delivers one), for strategies tested in-process without a running app."""
    for name in ("run_id", "node_id", "task_id"):  # a Message needs the identity of the task that makes it
        setattr(TaskIdentity, name, 1)
    request = Message(RecordDict(), dst_node_id=node_id, message_type=MessageType.TRAIN)
    request.metadata.__dict__["_message_id"] = f"request-to-{node_id}"
    reply = (
        Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=error), reply_to=request)
        if error
        else Message(content if content is not None else RecordDict(), reply_to=request)
    )
    reply.metadata.__dict__["_message_id"] = f"reply-from-{node_id}"
    return reply


def train_content(names, arrays, num_examples: int, loss: float = 0.5) -> RecordDict:
    """A well-formed training reply."""
    return RecordDict(
        {
            "arrays": to_record(names, arrays),
            "metrics": MetricRecord({"num-examples": num_examples, "train-loss": loss}),
        }
    )


def metrics_only(**metrics) -> RecordDict:
    """A reply holding only metrics."""
    return RecordDict({"metrics": MetricRecord(metrics)})


__all__ = ["ArrayRecord", "BlockingGrid", "FakeReply", "hand_made_runner", "metrics_only", "train_content"]


def hand_made_runner(cfg, specs, initial, sizes: dict[int, int], node_base: int = 100):
    """A RoundRunner for `cfg.algorithm` on a hand-made model layout, with clients pid -> num_train registered as
    nodes node_base + pid."""
    from common.learning.models import ModelLayout
    from server_app.clients import ClientInfo, ClientRegistry
    from server_app.runner import RoundRunner
    from server_app.strategies import strategy_class

    clients = ClientRegistry()
    for pid, num_train in sizes.items():
        clients.add(ClientInfo(pid, node_base + pid, num_train, 5))
    strategy = strategy_class(cfg.algorithm)(cfg, ModelLayout(list(initial), list(specs)), clients)
    return RoundRunner(cfg, strategy, clients)


class BlockingGrid:
    """push_messages / pull_messages over the subclass's `send_and_receive(messages, timeout)` (Flower's blocking
    call, which fakes of a handshake implement): every pushed message is answered at the next pull."""

    def push_messages(self, messages: Iterable[Any]) -> list[str]:
        pushed = self.__dict__.setdefault("_pushed", {})
        ids = []
        for msg in messages:
            ids.append(f"b{len(pushed)}")
            pushed[ids[-1]] = msg
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Any]:
        pushed = self.__dict__.setdefault("_pushed", {})
        ids = [mid for mid in message_ids if mid in pushed]
        replies = self.send_and_receive([pushed.pop(mid) for mid in ids], timeout=None)  # type: ignore[attr-defined]
        for mid, reply in zip(ids, replies, strict=True):
            reply.metadata.__dict__["_reply_to_message_id"] = mid
        return list(replies)


class PushPullGrid:
    """A Grid's push_messages / pull_messages over `answer(messages) -> one reply per message, in order`: pushed
    messages are answered at a later pull, at most `per_pull` of them per pull (all by default)."""

    def __init__(self, answer: Callable[[list[Any]], list[Any]], per_pull: int = 0) -> None:
        self.answer, self.per_pull = answer, per_pull
        self.waiting: list[tuple[str, Any]] = []
        self.most_outstanding = 0
        self._ids = itertools.count()

    def push_messages(self, messages: Iterable[Any]) -> list[str]:
        ids = []
        for msg in messages:
            ids.append(f"m{next(self._ids)}")
            self.waiting.append((ids[-1], msg))
        self.most_outstanding = max(self.most_outstanding, len(self.waiting))
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Any]:
        wanted = set(message_ids)
        take = [(mid, msg) for mid, msg in self.waiting if mid in wanted][: self.per_pull or None]
        taken = {mid for mid, _ in take}
        self.waiting = [(mid, msg) for mid, msg in self.waiting if mid not in taken]
        replies = self.answer([msg for _, msg in take])
        for (mid, _), reply in zip(take, replies, strict=True):
            reply.metadata.__dict__["_reply_to_message_id"] = mid  # the id this grid pushed it under
        return replies
