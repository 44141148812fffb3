"""`pflower-clientapp` (client_app/warm.py), a ClientApp process that lives across messages: its dispatch (serve
here, or one-shot and start anew for another FAB or after --max-messages) and its command line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from client_app.warm import Dispatcher, WarmApp, parse_args, serves

CLIENT_APP = "flwr-clientapp"


def _task(fab_hash: str, kind: str = CLIENT_APP, task_id: int = 1) -> SimpleNamespace:
    return SimpleNamespace(type=kind, fab_hash=fab_hash, task_id=task_id)


class Calls:
    """Records what a Dispatcher did."""

    def __init__(self, warm: WarmApp) -> None:
        self.warm, self.served, self.one_shots, self.restarts = warm, [], [], 0

    def serve(self, token: str) -> bool:
        self.served.append(token)
        self.warm.fab_hash = self.warm.fab_hash or "aaa"  # what load_app does at the first message
        return True

    def one_shot(self, token: str) -> int:
        self.one_shots.append(token)
        return 0

    def restart(self) -> None:
        self.restarts += 1


def _dispatcher(max_messages: int = 0) -> tuple[Dispatcher, Calls]:
    warm = WarmApp()
    calls = Calls(warm)
    return Dispatcher(calls.serve, calls.one_shot, calls.restart, warm, max_messages), calls


def test_messages_of_the_loaded_app_are_served_here_and_another_app_version_runs_once_then_starts_anew() -> None:
    dispatcher, calls = _dispatcher()
    assert dispatcher.handle("t1", _task("aaa")) and dispatcher.handle("t2", _task("aaa"))
    assert calls.served == ["t1", "t2"] and calls.one_shots == [] and calls.restarts == 0
    assert dispatcher.handle("t3", _task("bbb")) is False  # new FAB: one-shot, then exec anew
    assert calls.served == ["t1", "t2"] and calls.one_shots == ["t3"] and calls.restarts == 1
    assert dispatcher.warm.served == 2


def test_a_task_that_is_not_a_clientapp_message_is_left_and_max_messages_starts_anew() -> None:
    dispatcher, calls = _dispatcher(max_messages=2)
    assert dispatcher.handle("s", _task("aaa", kind="flwr-serverapp"))
    assert calls.served == [] and calls.one_shots == []
    assert dispatcher.handle("t1", _task("aaa")) is True
    assert dispatcher.handle("t2", _task("aaa")) is False and calls.restarts == 1


def test_serves_the_first_app_it_sees_and_then_only_that_one() -> None:
    warm = WarmApp()
    assert serves(warm, "x") and serves(warm, "")
    warm.fab_hash = "x"
    assert serves(warm, "x") and not serves(warm, "y") and serves(warm, "")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--runtime-api-address", "127.0.0.1:9094"], "one of the arguments --insecure --root-certificates"),
        (["--runtime-api-address", "a:1", "--insecure", "--poll-seconds", "0"], "--poll-seconds must be between"),
        (["--runtime-api-address", "a:1", "--insecure", "--max-messages", "-1"], "--max-messages must be 0 or more"),
        (["--runtime-api-address", "a:1", "--root-certificates", "/nonexistent/ca.crt"], "no such file"),
    ],
)
def test_bad_command_lines_exit_2_with_one_line(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
