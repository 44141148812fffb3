"""One experiment run of the CLI: its run config and folder, whether it finished, resumes or starts, and running it
on an engine (in-process, or `flwr run` on a private SuperLink)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import parse_run_config
from common.hparams import ConfigError
from common.storage.persist import open_for_append, private_folder
from common.storage.run_folder import RunFolder, Summary
from common.storage.run_lock import holder
from experiments.run.cpu_share import CpuMeter, CpuShare
from experiments.run.launchers import FINISHED, Engine
from experiments.run.output import plain
from experiments.run.presets import Preset


@dataclass(frozen=True)
class RunSpec:
    """One run: its folder name (experiment and seed), run config and federation."""

    name: str
    experiment: str
    seed: int
    run_config: dict[str, Any]
    clients: int
    preset: Preset


@dataclass(frozen=True)
class RunResult:
    """How a run ended: 'finished', 'failed' or 'skipped' (finished earlier), its folder, seconds and log."""

    spec: RunSpec
    status: str
    run_dir: Path
    seconds: float
    log: Path | None = None
    reason: str = ""


def parse_seeds(text: str | list[int]) -> list[int]:
    """'0,1,2' (or a list) -> [0, 1, 2]; ConfigError for anything else."""
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        seeds = [int(str(item).strip()) for item in items if str(item).strip()]
    except ValueError:
        raise ConfigError(f"seeds {text!r} must be comma-separated integers, e.g. 0,1,2") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"seeds {text!r} must be distinct non-negative integers, e.g. 0,1,2")
    return seeds


def parse_assignment(text: str) -> tuple[str, Any]:
    """'key=value' of --set: value as int, float, true/false, or the string itself."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r} must be KEY=VALUE, e.g. --set lr=0.1")
    raw = raw.strip().strip("'\"")
    value: Any = raw
    if raw.lower() in ("true", "false"):
        value = raw.lower() == "true"
    else:
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                continue
    return key.strip(), value


def folder_name(name: object, what: str, plus: bool = False) -> str:
    """`name` when it is one plain folder name (never '..', a separator or an absolute path); ConfigError else."""
    # an experiment's runs are folders <name>-seed<N>, the run-config `run-name` (at most 100 characters, no '+');
    # '+' in a sweep's [[table]] row 'NAME+' marks experiment NAME's evaluation row. A sweep's name is a folder too.
    chars, longest = (r"._+-", 100) if plus else (r"._-", 81)
    if isinstance(name, str) and re.fullmatch(rf"[A-Za-z0-9][A-Za-z0-9{re.escape(chars)}]{{0,{longest - 1}}}", name):
        return name
    allowed = ", ".join(f"'{c}'" for c in chars)
    raise ConfigError(
        f"{what} {name!r} must be a plain folder name: letters, digits, {allowed}, starting with a letter or "
        f"digit, at most {longest} characters (no '/', '\\', '..' or absolute path)"
    )


def absolute_data_dir(run_config: dict[str, Any]) -> dict[str, Any]:
    """The run config with a relative `data-dir` made absolute against the current folder: the run reads it from
    another folder (a simulation's SuperLink starts elsewhere)."""
    raw = run_config.get("data-dir")
    if not isinstance(raw, str) or not raw or Path(raw).expanduser().is_absolute():
        return run_config
    return {**run_config, "data-dir": str(Path.cwd() / raw)}


def plan(
    experiment: str, preset: Preset, config: dict[str, Any], seeds: list[int], clients: int | None = None
) -> list[RunSpec]:
    """One RunSpec per seed, the run config checked now (a bad key stops everything before any run starts)."""
    folder_name(experiment, "experiment name")
    merged = {**preset.run_config, **config}
    for reserved in ("seed", "run-name", "results-dir", "resume"):
        if reserved in config:
            raise ConfigError(f"experiment {experiment}: '{reserved}' is set by the CLI (use --seeds / --out)")
    specs = []
    for seed in seeds:
        run_config = absolute_data_dir({**merged, "seed": seed})
        try:
            parse_run_config(run_config)
        except ConfigError as exc:
            raise ConfigError(f"experiment {experiment}: {exc}") from None
        specs.append(
            RunSpec(f"{experiment}-seed{seed}", experiment, seed, run_config, clients or preset.clients, preset)
        )
    return specs


def run_state(run_dir: Path) -> str:
    """'finished' (its summary written), 'running' (a live server holds it), 'resumable' (a checkpoint),
    'incomplete' (neither) or 'new'."""
    folder = RunFolder(run_dir)
    if folder.finished():
        return "finished"
    if holder(run_dir) is not None:
        return "running"
    if folder.resumable():
        return "resumable"
    return "incomplete" if run_dir.exists() else "new"


SUPERSEDED_FOLDER = "superseded"  # beside a sweep's runs: the run folders set aside, each under <name>-<time>


def set_aside(run_dir: Path) -> Path:
    """Move a run folder out of a new attempt's way, to superseded/<name>-<time> beside it (nothing is deleted);
    returns where it went."""
    aside = run_dir.parent / SUPERSEDED_FOLDER / f"{run_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    private_folder(aside.parent)
    while aside.exists():  # two set aside within one second
        aside = aside.with_name(aside.name + "-1")
    shutil.move(str(run_dir), aside)
    return aside


def stopped_line(run_dir: Path) -> str:
    """Where an interrupted run stands: the rounds it recorded and the round its kept checkpoint resumes from."""
    from server_app.checkpoint import last_checkpoint_round, load_checkpoint, read_run_id

    folder = RunFolder(run_dir)
    try:
        rounds = len(folder.rounds()) if folder.metrics_path.is_file() else 0
        planned = int(folder.config().get("num-rounds", 0)) if folder.config_path.is_file() else 0
        run_id = read_run_id(run_dir)
    except (OSError, ValueError, TypeError, AttributeError):
        return f"{run_dir}: stopped; its files could not be read"
    of = f" of {planned}" if planned else ""
    if not folder.checkpoint_path.is_file():
        return f"{run_dir}: stopped after {rounds}{of} rounds, before its first checkpoint; it starts anew"
    kept = last_checkpoint_round(run_id) if run_id else None
    if kept is None:  # stopped between writing the checkpoint and noting its round: the checkpoint says
        try:
            kept = load_checkpoint(run_dir).round
        except (OSError, ValueError):  # StateFileError is a ValueError
            kept = None
    at = f" of round {kept}" if kept is not None else ""
    return f"{run_dir}: stopped after {rounds}{of} rounds; its checkpoint{at} is kept and the same command resumes it"


def drop_resume_state(run_dir: Path) -> int:
    """Delete a finished run's server checkpoint and simulated clients' state, which only a run stopped midway
    reads (a FedAMP run's come to gigabytes); returns the bytes freed. An unfinished run is left as it is."""
    if run_state(run_dir) != "finished":
        return 0
    freed, folder = 0, RunFolder(run_dir)
    checkpoint = folder.checkpoint_path
    if checkpoint.is_file():
        freed += checkpoint.stat().st_size
        checkpoint.unlink()
    clients = folder.client_state_path
    if clients.is_dir():
        freed += sum(f.stat().st_size for f in clients.rglob("*") if f.is_file())
        shutil.rmtree(clients)
    return freed


KEPT_ASIDE = ("seed", "run-name", "results-dir", "resume", "data-dir", "client-state-dir")  # not the setting


def changed_settings(spec: RunSpec, run_dir: Path) -> list[str]:
    """The run-config keys whose value in a kept run's saved config differs from what `spec` asks now, as
    'key: was -> now' (empty when the folder holds no config yet or the same settings); the keys of other algorithms
    than the run's are not its settings."""
    folder = RunFolder(run_dir)
    return settings_differ(spec.run_config, folder.config()) if folder.is_run() else []


def settings_differ(asked: dict[str, Any], saved: dict[str, Any]) -> list[str]:
    """The run-config keys whose value differs between what a spec asks and what a run saved, as 'key: was -> now'
    (the keys of other algorithms than the run's are not its settings); one line when the saved config is not one
    today's code reads."""
    try:
        was = parse_run_config({k: v for k, v in saved.items() if k not in KEPT_ASIDE}).settings_dict()
    except ConfigError as exc:
        return [f"made by another version of the code ({exc})"]
    now = parse_run_config({k: v for k, v in asked.items() if k not in KEPT_ASIDE}).settings_dict()
    return [f"{k}: {was.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]


def execute(
    engine: Engine,
    app_dir: Path,
    spec: RunSpec,
    out_dir: Path,
    gpu: bool,
    echo: Callable[[str], None],
    timeout: float = 86_400.0,
) -> RunResult:
    """Run `spec` on `engine` into out_dir/<name> (resumed from its checkpoint when an earlier attempt stopped); the
    full output goes to out_dir/logs/<name>.log, each line also to `echo`. `app_dir` is the code that runs (its
    commit is recorded in the run folder)."""
    run_dir = out_dir / spec.name
    state = run_state(run_dir)
    if state == "finished":
        return RunResult(spec, "skipped", run_dir, 0.0)
    if state == "running":  # another sweep's (or pflower run's) server: neither resumed nor set aside under it
        who = holder(run_dir) or "another server"
        return RunResult(spec, "failed", run_dir, 0.0, reason=f"its folder is in use by {who}")
    if state == "incomplete":  # stopped before its first checkpoint: nothing to resume, set it aside
        aside = out_dir / "incomplete" / f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        private_folder(aside.parent)
        shutil.move(str(run_dir), aside)
    config = {
        **spec.run_config,
        "results-dir": str(out_dir),
        "run-name": spec.name,
        **({"resume": str(run_dir)} if state == "resumable" else {}),
    }
    logs = out_dir / "logs"
    private_folder(logs)
    log_path = logs / f"{spec.name}.log"
    commit = app_commit(app_dir)
    recorded = False
    started = time.monotonic()
    with open_for_append(log_path) as log_file:
        log_file.write(f"# engine: {engine.name}\n")

        def both(line: str) -> None:
            nonlocal recorded
            log_file.write(plain(line) + "\n")
            log_file.flush()
            if not recorded and run_dir.is_dir():  # as soon as the server made the folder: a kill later keeps it
                record_code(run_dir, commit)
                recorded = True
            echo(line)

        meter = CpuMeter()
        try:
            with meter:
                outcome = engine.run(
                    config,
                    spec.clients,
                    timeout,
                    both,
                    spec.preset.cpus_per_client,
                    spec.preset.gpus_per_client if gpu else 0.0,
                )
        finally:  # a stopped attempt (Ctrl+C, SIGTERM) counts too: its resume sums every attempt's seconds
            if run_dir.is_dir():
                record_code(run_dir, commit)
                if engine.counts_its_cpu and meter.share is not None:
                    record_cpu(run_dir, meter.share)
    seconds = time.monotonic() - started
    if outcome.status == FINISHED and RunFolder(run_dir).finished():
        return RunResult(spec, "finished", run_dir, seconds, log_path)
    reason = _last_error(outcome.output) or f"the run exited {outcome.returncode}, status {outcome.status}"
    return RunResult(spec, "failed", run_dir, seconds, log_path, reason)


def _git(folder: Path, *args: str) -> str | None:
    """`git -C folder ARGS`'s output, stripped; None when it fails (not a checkout, or no git)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def short_commit(folder: Path) -> str:
    """The git commit (short) the folder's checkout is at; '' outside a checkout."""
    return _git(folder, "rev-parse", "--short", "HEAD") or ""


# what does not make a run's numbers: documents, tests, benchmark drivers and sweep files (a run's settings are in
# its config.json), deployment recipes; an edit of these while a sweep runs does not mark its runs '+changes'
NOT_CODE = ("docs", "tests", "bench", "deploy", ".ci", "*.md")


def app_commit(app_dir: Path) -> str:
    """The app folder's git commit (short), with '+changes' when its tracked code differs from it (NOT_CODE
    aside); '' when the folder is not a git checkout (or git is missing)."""
    head = short_commit(app_dir)
    if not head:
        return ""
    code = [".", *(f":(exclude){path}" for path in NOT_CODE)]
    return head + ("+changes" if _git(app_dir, "status", "--porcelain", "--untracked-files=no", "--", *code) else "")


def record_code(run_dir: Path, commit: str) -> None:
    """Add `commit` to the run folder's record of the commits that made it (in the order the attempts ran)."""
    folder = RunFolder(run_dir)
    commits = folder.commits()
    if commit and commit not in commits:
        folder.write_commits([*commits, commit])


def record_cpu(run_dir: Path, share: CpuShare) -> None:
    """Add one attempt's CPU seconds to the run folder's (a resumed run sums its attempts)."""
    folder = RunFolder(run_dir)
    before = CpuShare.from_dict(folder.cpu())
    folder.write_cpu((share if before is None else before + share).to_dict())


def run_commits(run_dir: Path) -> list[str]:
    """The commits recorded for a run folder (empty when none was: a run made outside a git checkout, or by an
    older version of the CLI)."""
    return RunFolder(run_dir).commits()


GENERIC = ("Exit Code", "Simulation raised", "raised an exception", "Traceback")  # Flower's lines after ours


def _last_error(output: str) -> str:
    """The first specific ERROR line of a run's output (the server app explains a failure in one line; Flower's
    generic ones follow it), without colours and prefix."""
    errors = [plain(line).split("ERROR", 1)[1].strip(" :\t") for line in output.splitlines() if "ERROR" in line]
    specific = [e for e in errors if e and not any(g in e for g in GENERIC)]
    return (specific or errors or [""])[0]


def summary_of(run_dir: Path) -> Summary:
    """A finished run's summary."""
    return RunFolder(run_dir).summary()
