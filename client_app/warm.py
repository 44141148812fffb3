"""A ClientApp process that lives across messages: `pflower-clientapp`, the executor of a SuperNode started with
`--isolation process`, in place of `flower-superexec`.

Flower 1.42's executor starts one `flwr-clientapp` process for every message, so every message pays for importing
torch and Flower, installing the FAB and loading the app (about 3 CPU-seconds here, most of a small round on a
Pi-class core). This process asks the SuperNode's Runtime API for work as `flower-superexec` does (AcquireTask, with
the SuperExec secret when the SuperNode has one) and runs each ClientApp message in itself, with Flower's own task
functions (pull the message, context and FAB; push the reply and the task's outcome): the imports, the loaded app and
its caches (data sets, partitions) are paid for once. Client state stays crash-safe: every message still persists it
before replying, as in a one-shot process. A message of another FAB (a new app version) runs in a one-shot
`flwr-clientapp` as Flower would, after which this process starts itself anew, so two versions of the app never
share one interpreter. A failed message is answered with an error reply and the process goes on.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

WARM_COMMAND = "pflower-clientapp"
DEFAULT_POLL_SECONDS = 0.2


@dataclass
class WarmApp:
    """The one app this process serves, loaded at its first message: its FAB hash and the ClientApp."""

    fab_hash: str | None = None
    app: Any = None
    served: int = 0


def serves(warm: WarmApp, fab_hash: str) -> bool:
    """Whether a message of this FAB may run in this process (the first FAB it sees, or the one it loaded)."""
    return warm.fab_hash is None or not fab_hash or warm.fab_hash == fab_hash


def runtime_client(address: str, certificates: bytes | None, interceptors: list[Any]) -> Any:
    """A Runtime API client of the SuperNode (TLS when certificates are given)."""
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.runtime.tracing import RuntimeTracingInterceptor

    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=certificates is None,
        root_certificates=certificates,
        interceptors=[RuntimeTracingInterceptor(), *interceptors],
        retry_invoker=make_simple_http_retry_invoker(),
    )


def load_app(warm: WarmApp, run: Any, fab: Any) -> Any:
    """The ClientApp of this FAB: installed and loaded at the first message, reused after."""
    if warm.app is None:
        from flwr.cli.install import install_from_fab
        from flwr.clientapp.utils import get_load_client_app_fn

        install_from_fab(fab.content, skip_prompt=True)
        load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
        warm.app = load(run.fab_id, run.fab_version, fab.hash_str)
        warm.fab_hash = fab.hash_str
    return warm.app


def serve_task(address: str, token: str, certificates: bytes | None, warm: WarmApp) -> bool:
    """Run one ClientApp message in this process and push its reply and outcome; whether it completed."""
    from flwr.app import Message
    from flwr.app.error import Error
    from flwr.clientapp.client_app import LoadClientAppError
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.supercore import log
    from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

    client = runtime_client(
        address,
        certificates,
        [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"), RuntimeTokenHttpInterceptor(token)],
    )
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    heartbeat.start()
    message = reply = context = None
    sub_status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
    try:
        message, context, run, fab = pull_task_input(client)
        reply = load_app(warm, run, fab)(message=message, context=context)
        sub_status, details = SubStatus.COMPLETED, ""
    except Exception as error:  # one message's failure is its error reply, as in a one-shot process
        code = ErrorCode.LOAD_CLIENT_APP_EXCEPTION if isinstance(error, LoadClientAppError) else None
        reason = f"{type(error)}:<'{error}'>"
        log(ERROR, "ClientApp raised an exception", exc_info=error)
        details = reason
        if message is not None:
            reply = Message(Error(code=code or ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
        except Exception as error:  # the SuperNode then sees the task fail, as Flower's does
            log(ERROR, "Failed to push reply message", exc_info=error)
            sub_status = SubStatus.FAILED
        push_task_output(client=client, context=context, sub_status=sub_status, details=details)
        heartbeat.stop()
        client.close()
    return sub_status == SubStatus.COMPLETED


def one_shot(address: str, token: str, certificates_path: str | None) -> int:
    """Run one message in a fresh `flwr-clientapp` process (the token on its standard input); its exit status."""
    command = ["flwr-clientapp", "--runtime-api-address", address, "--token-stdin"]
    command += ["--root-certificates", certificates_path] if certificates_path else ["--insecure"]
    return subprocess.run(command, input=token + "\n", text=True, check=False).returncode


def restart_self() -> None:
    """Start this process anew with the same arguments (a fresh interpreter for a new app version)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "client_app.warm", *sys.argv[1:]])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, as `flower-superexec`'s where they mean the same."""
    parser = argparse.ArgumentParser(prog=WARM_COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API, HOST:PORT")
    tls = parser.add_mutually_exclusive_group(required=True)
    tls.add_argument("--insecure", action="store_true", help="reach the Runtime API without TLS (loopback)")
    tls.add_argument("--root-certificates", help="CA certificate of the Runtime API's TLS certificate")
    parser.add_argument("--superexec-auth-secret-file", help="the SuperNode's SuperExec secret (raw bytes)")
    parser.add_argument("--parent-pid", type=int, help="exit when this process (the SuperNode) exits")
    parser.add_argument(
        "--poll-seconds", type=float, default=DEFAULT_POLL_SECONDS, help="wait between asks for work (0.01-60)"
    )
    parser.add_argument("--max-messages", type=int, default=0, help="start anew after this many messages (0: never)")
    args = parser.parse_args(argv)
    if not 0.01 <= args.poll_seconds <= 60:
        parser.error(f"--poll-seconds must be between 0.01 and 60, got {args.poll_seconds}")
    if args.max_messages < 0:
        parser.error(f"--max-messages must be 0 or more, got {args.max_messages}")
    for name in ("root_certificates", "superexec_auth_secret_file"):
        path = getattr(args, name)
        if path is not None and not Path(path).is_file():
            parser.error(f"--{name.replace('_', '-')}: no such file: {path}")
    return args


def acquire_loop(args: argparse.Namespace, handle: Callable[[str, Any], bool]) -> None:
    """Ask the SuperNode for ClientApp work until stopped; `handle(token, task)` False ends the loop."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor, SuperExecAuthHttpInterceptor

    certificates = Path(args.root_certificates).read_bytes() if args.root_certificates else None
    interceptors: list[Any] = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if args.superexec_auth_secret_file:
        secret = Path(args.superexec_auth_secret_file).read_bytes()
        interceptors.append(
            SuperExecAuthHttpInterceptor(master_secret=secret, protected_methods={"/flwr.proto.Runtime/AcquireTask"})
        )
    client = runtime_client(args.runtime_api_address, certificates, interceptors)
    try:
        while True:
            answer = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP.value]))
            if answer.HasField("task") and answer.token and not handle(answer.token, answer.task):
                return
            time.sleep(args.poll_seconds)
    finally:
        client.close()


@dataclass
class Dispatcher:
    """What to do with each task the SuperNode hands out: serve it here, or in a one-shot process and then start
    anew (another FAB), and start anew after `max_messages`."""

    serve: Callable[[str], bool]  # run one message (its token) in this process
    one_shot: Callable[[str], int]  # run one message in a fresh `flwr-clientapp`
    restart: Callable[[], None]  # exec this process anew (does not return in use)
    warm: WarmApp
    max_messages: int = 0

    def handle(self, token: str, task: Any) -> bool:
        """Dispatch one acquired task; False: stop asking for work (after a restart that returned, in tests)."""
        from flwr.supercore import log
        from flwr.supercore.constant import TaskType

        if task.type != TaskType.CLIENT_APP.value:
            log(WARNING, "%s: task %d (%s) is not a ClientApp message; left", WARM_COMMAND, task.task_id, task.type)
            return True
        if not serves(self.warm, task.fab_hash):
            log(
                INFO,
                "%s: a new app version (FAB %s): this message in a one-shot process, then a fresh start",
                WARM_COMMAND,
                task.fab_hash[:12],
            )
            self.one_shot(token)
            self.restart()
            return False
        self.serve(token)
        self.warm.served += 1
        if self.max_messages and self.warm.served >= self.max_messages:
            log(INFO, "%s: %d messages served; starting anew (--max-messages)", WARM_COMMAND, self.warm.served)
            self.restart()
            return False
        return True


def main(argv: list[str] | None = None) -> int:
    """Serve ClientApp messages until stopped (SIGTERM, or the SuperNode named by --parent-pid exits)."""
    args = parse_args(argv)
    import torch  # noqa: F401 - imported once here, so no message pays for it
    from flwr.supercore import log
    from flwr.supercore.app_utils import start_parent_process_monitor

    if args.parent_pid is not None:
        start_parent_process_monitor(args.parent_pid)
    certificates = Path(args.root_certificates).read_bytes() if args.root_certificates else None
    warm = WarmApp()
    dispatcher = Dispatcher(
        serve=lambda token: serve_task(args.runtime_api_address, token, certificates, warm),
        one_shot=lambda token: one_shot(args.runtime_api_address, token, args.root_certificates),
        restart=restart_self,
        warm=warm,
        max_messages=args.max_messages,
    )
    log(
        INFO,
        "%s: serving ClientApp messages from %s in this process (pid %d)",
        WARM_COMMAND,
        args.runtime_api_address,
        os.getpid(),
    )
    try:
        acquire_loop(args, dispatcher.handle)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
