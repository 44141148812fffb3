"""A busy SuperLink delays a round instead of ending the run: a pull of replies or of the connected nodes answered
with a server error (the SuperLink's SQLite 'database is locked', HTTP 500, under load; Flower retries only 502-504)
is asked again with backoff; an error that is not transient, or one that lasts past the patience, still stops it."""

from __future__ import annotations

import logging

import httpx
import pytest

from server_app.exchange import each_reply, exchange, patient

from .fakes import FakeReply, PushPullGrid


def _status(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/v1/runtime/pull-messages")
    return httpx.HTTPStatusError("error", request=request, response=httpx.Response(code, request=request))


class FailingFirst(PushPullGrid):
    """Answers every message, after its first `failures` pulls failed with `error`."""

    def __init__(self, failures: int, error: Exception) -> None:
        super().__init__(lambda pids: [FakeReply(pid) for pid in pids])
        self.failures, self.error, self.pulls = failures, error, 0

    def pull_messages(self, message_ids):
        self.pulls += 1
        if self.pulls <= self.failures:
            raise self.error
        return super().pull_messages(message_ids)


def test_replies_pulled_through_two_server_errors_all_arrive(caplog, monkeypatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("server_app.exchange.time.sleep", slept.append)
    grid = FailingFirst(2, _status(500))
    with caplog.at_level(logging.WARNING, logger="flwr"):
        answered = [r.metadata.src_node_id for r in each_reply(exchange(grid, [1, 2, 3], list, 3, 60.0))]
    assert answered == [1, 2, 3] and grid.pulls == 3
    assert slept[:2] == [0.5, 1.0], "backoff doubles"
    warned = [
        r.getMessage() for r in caplog.records if "failed to answer a pull of replies (HTTP 500)" in r.getMessage()
    ]
    assert len(warned) == 2


@pytest.mark.parametrize("error", [_status(500), _status(503), httpx.ReadError("connection dropped")])
def test_a_transient_error_is_asked_again_until_the_patience_runs_out(error: Exception) -> None:
    calls, slept = [], []

    def read() -> list[int]:
        calls.append(1)
        raise error

    with pytest.raises(type(error)):
        patient(read, "the connected nodes", patience=10.0, sleep=slept.append)
    assert slept == [0.5, 1.0, 2.0, 4.0, 8.0] and len(calls) == 6, "0.5 s doubling, given up once 10 s are spent"


@pytest.mark.parametrize("error", [_status(400), _status(413), ValueError("a bug")])
def test_an_error_that_is_not_transient_is_raised_at_once(error: Exception) -> None:
    slept: list[float] = []

    def read() -> None:
        raise error

    with pytest.raises(type(error)):
        patient(read, "a pull of replies", sleep=slept.append)
    assert slept == []


def test_the_connected_nodes_are_read_through_a_server_error(monkeypatch) -> None:
    from server_app.clients import ClientRegistry

    monkeypatch.setattr("server_app.exchange.time.sleep", lambda s: None)

    class Grid(PushPullGrid):
        reads = 0

        def get_node_ids(self):
            Grid.reads += 1
            if Grid.reads == 1:
                raise _status(500)
            return []  # nobody new: no handshake

    registry = ClientRegistry(max_samples=100, takeover_after=60.0, max_weight_ratio=0.0, simulated=True)
    assert registry.refresh(Grid(lambda msgs: []), 1.0) == []
    assert Grid.reads == 2, "read again after the server error, not raised into the run"
