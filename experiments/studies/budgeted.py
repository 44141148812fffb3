"""Budgeted sweeps that land their work: the owed runs of one or more studies in priority order (the files in the
order given; within a file, seed by seed, so every experiment gets its first seed before any gets its third),
never starting a run whose estimate does not fit in what is left of the budget, each finished run's record written
(and, with `commit`, committed alone) the moment it finishes."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from common.hparams import ConfigError
from common.storage.run_folder import RunFolder
from experiments.run.runs import RunResult, app_commit, run_state
from experiments.run.runs import set_aside as set_aside_folder
from experiments.studies.behaviour import PROJECT, behaviour_hashes, cases_of, code_digest
from experiments.studies.records import CodeInfo, data_fingerprint, make_record, record_path, write_record
from experiments.studies.status import RunState, StudyState, study_state

_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")


def parse_budget(text: str) -> float:
    """'2h30m', '90m', '1.5h', '45s' -> seconds (ConfigError for anything else)."""
    compact = text.strip().lower().replace(" ", "")
    parts = _PART.findall(compact)
    if not compact or not parts or "".join(n + u for n, u in parts) != compact:
        raise ConfigError(f"--budget {text!r}: hours, minutes and seconds such as 2h30m, 90m or 1.5h")
    seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if not seconds > 0:
        raise ConfigError(f"--budget {text!r} must be more than zero")
    return seconds


def owed_in_order(studies: list[StudyState]) -> list[tuple[StudyState, RunState]]:
    """Every owed run: tier by tier (1 first); within a tier the studies in the order given, each one's runs seed
    by seed in the file's order."""
    owed = [(s, r, i, j) for i, s in enumerate(studies) for j, r in enumerate(s.runs) if r.owed]
    owed.sort(key=lambda item: (item[1].tier, item[2], item[1].spec.seed, item[3]))
    return [(s, r) for s, r, _, _ in owed]


@dataclass(frozen=True)
class Outcome:
    """What a budgeted sweep did: runs landed, runs that failed, runs left for a GPU or for a later budget."""

    landed: list[str]
    failed: list[str]
    gpu: list[str]
    not_fitted: list[str]


def run_budgeted(
    studies: list[StudyState],
    budget_s: float,
    run_one: Callable[[StudyState, RunState], RunResult],
    land: Callable[[StudyState, RunState, RunResult], None],
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """Run the owed runs that fit, landing each finished one at once."""
    started = clock()
    landed: list[str] = []
    failed: list[str] = []
    gpu: list[str] = []
    not_fitted: list[str] = []
    order = owed_in_order(studies)
    say(f"budget: {len(order)} owed run(s) in {len(studies)} study file(s), {budget_s / 3600:.2f} h to spend")
    for study, run in order:
        name = f"{study.sweep.name}/{run.spec.name}"
        if run.needs_gpu:
            gpu.append(name)
            say(f"budget: {name} needs a GPU (~{run.hours:.1f} h here): not started")
            continue
        left = budget_s - (clock() - started)
        if run.hours * 3600 > left:
            not_fitted.append(name)
            say(f"budget: {name} (~{run.hours * 60:.0f} min) does not fit in the {left / 60:.0f} min left: not started")
            continue
        say(f"budget: {name} ({run.state}, ~{run.hours * 60:.0f} min; {left / 60:.0f} min left)")
        result = run_one(study, run)
        if result.status in ("finished", "skipped"):
            land(study, run, result)
            landed.append(name)
        else:
            failed.append(name)
    return Outcome(landed, failed, gpu, not_fitted)


def budget_plan(studies: list[StudyState], budget_s: float) -> list[str]:
    """What `run_budgeted` would do if every run took its estimate, one line a run, nothing run (`--list`)."""
    order = owed_in_order(studies)
    lines = [f"budget: {len(order)} owed run(s) in {len(studies)} study file(s), {budget_s / 3600:.2f} h to spend"]
    left = budget_s
    planned = 0.0
    for study, run in order:
        name = f"{study.sweep.name}/{run.spec.name}"
        if run.needs_gpu:
            lines.append(f"  {name}: needs a GPU (~{run.hours:.1f} h here): not started")
        elif run.hours * 3600 > left:
            lines.append(f"  {name}: ~{run.hours * 60:.0f} min, does not fit in the ~{left / 60:.0f} min left")
        else:
            left -= run.hours * 3600
            planned += run.hours
            lines.append(f"  {name}: would run ({run.state}, ~{run.hours * 60:.0f} min)")
    lines.append(f"budget: ~{planned * 60:.0f} min of runs would start (estimates; nothing was run)")
    return lines


def set_aside(run_dir: Path) -> Path | None:
    """Move a finished run folder whose record is stale (or was made with other settings) out of the sweep's way, so
    the run is made again; returns where it went."""
    return set_aside_folder(run_dir) if run_state(run_dir) == "finished" else None


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120, check=False)


@contextmanager
def code_at(commit: str, project: Path = PROJECT) -> Iterator[Path]:
    """A temporary checkout of `commit` with today's experiments/studies in it, so that a run made by that commit
    gets its behaviour hash from the code that made it."""
    with tempfile.TemporaryDirectory(prefix="pflower-code-") as tmp:
        tree = Path(tmp) / "code"
        done = _git(project, "worktree", "add", "--detach", str(tree), commit)
        if done.returncode != 0:
            raise ConfigError(f"cannot check out commit {commit} to hash its behaviour: {done.stderr.strip()}")
        try:
            studies = tree / "experiments" / "studies"
            studies.mkdir(parents=True, exist_ok=True)
            for source in (project / "experiments" / "studies").glob("*.py"):
                shutil.copyfile(source, studies / source.name)
            yield tree
        finally:
            _git(project, "worktree", "remove", "--force", str(tree))


def run_behaviour(run_dir: Path, config: dict, clients: int, digest_at_start: str | None = None) -> CodeInfo:
    """The commits that made a finished run and its behaviour hash under the code that made it: today's code on
    disk when the run started under it and it has not changed since (`digest_at_start`: code_digest() then), or when
    the run was made by this checkout's commit without uncommitted changes; else a temporary checkout of its one
    clean commit; 'unknown: ...' (never current) when none of these can be had."""
    commits = RunFolder(run_dir).commits()
    cases = cases_of([(config, clients)])
    if not cases:
        return CodeInfo(commits, "unknown: today's code does not accept its config")
    ((key, _),) = cases.items()
    if digest_at_start is not None:
        if digest_at_start == code_digest():
            return CodeInfo(commits, behaviour_hashes(cases)[key])
        return CodeInfo(commits, "unknown: the code changed while the run ran")
    if not commits or len(set(commits)) != 1 or commits[0].endswith("+changes") or not commits[0]:
        return CodeInfo(commits, f"unknown: made by {commits or 'unrecorded code'}, not one clean commit")
    if commits[0] == app_commit(PROJECT):
        return CodeInfo(commits, behaviour_hashes(cases)[key])
    with code_at(commits[0]) as tree:
        return CodeInfo(commits, behaviour_hashes(cases, tree)[key])


def land_record(
    study: StudyState,
    run: RunState,
    run_dir: Path,
    commit: bool,
    say: Callable[[str], None],
    digest: str | None = None,
    export: Path | None = None,
) -> Path:
    """Write a finished run's record into its study's records folder (and commit it alone, with `commit`); the data
    fingerprint is of the data set it read (`export`: the data export it read instead)."""
    from common.config import parse_run_config

    config = RunFolder(run_dir).config()
    code = run_behaviour(run_dir, config, run.spec.clients, digest)
    cfg = parse_run_config(run.spec.run_config)
    data = export_fingerprint(export) if export else data_fingerprint(cfg.dataset, cfg.data.data_dir)
    record = make_record(run_dir, study.sweep.name, run.spec.experiment, run.spec.clients, code, data)
    path = write_record(record_path(study.folder, run.spec.name), record)
    say(f"record: {path} ({path.stat().st_size / 1024:.0f} KiB, behaviour {code.behaviour})")
    documents = regenerate(study, say)
    if commit:
        message = f"Study record: {study.sweep.name} {run.spec.name} ({code.behaviour})"
        commit_record([path, *documents], message, say)
    return path


def regenerate(study: StudyState, say: Callable[[str], None]) -> list[Path]:
    """Write the study's documents and the headline table again from the records (what --check compares); returns
    the paths they and their figures are at (none when the study file declares no [[document]])."""
    from experiments.run.sweep import read_sweep
    from experiments.studies.documents import write_documents
    from experiments.studies.headline import HEADLINE, headline_studies, write_headline
    from experiments.studies.records import repository_root

    if not study.sweep.documents:
        return []
    try:
        written = [p for p, _, _ in write_documents(study.sweep_file, None, None, None)]
        root = repository_root(study.sweep_file)
        landed = study_state(study.sweep_file, read_sweep(study.sweep_file))  # with its new record, every run
        headline = write_headline(headline_studies([landed]), root / HEADLINE)
    except (ConfigError, OSError) as exc:
        say(f"record: WARNING: the documents were not regenerated ({exc}); `pflower results` writes them")
        return []
    folders = {p.parent / "figures" for p in written if (p.parent / "figures").is_dir()}
    return [*written, *sorted(folders), headline]


def export_fingerprint(path: Path) -> str:
    """A data export's fingerprint: 'export ' and the sha256 (short) of its file."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return "export " + digest.hexdigest()[:20]


def commit_record(paths: list[Path], message: str, say: Callable[[str], None]) -> None:
    """Commit a record and the documents made from it, alone (whatever else is staged or edited stays as it was)."""
    repo = paths[0].parent
    names = [str(p) for p in paths]
    added = _git(repo, "add", "--", *names)
    done = _git(repo, "commit", "-q", "-m", message, "--only", "--", *names) if added.returncode == 0 else added
    if done.returncode != 0:
        say(f"record: WARNING: not committed ({(done.stderr or done.stdout).strip()}); the files are kept")
    else:
        say(f"record: committed {paths[0].name}" + (f" and {len(paths) - 1} document path(s)" if paths[1:] else ""))
