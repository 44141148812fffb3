"""Results documents from run records: `pflower results FILE` writes a sweep file's [[document]]s from its records
(run folders without a record fill in), and `pflower results --check` says for every study file what is missing or
stale, with the hours to make it, and whether each committed document is what its records generate."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from common.hparams import ConfigError
from experiments.analysis.collect import Run
from experiments.analysis.results_doc import shown_path, write_results
from experiments.run.sweep import read_sweep
from experiments.studies.records import as_run
from experiments.studies.status import StudyState, check_lines, study_state, tier_lines

SWEEPS = Path("bench") / "sweeps"


def recorded_runs(study: StudyState) -> dict[str, Run]:
    """run name -> the run of each record of the study (current or stale; those made with other settings are not
    the study's runs now)."""
    out = {}
    for run in study.runs:
        if run.record is not None and run.state in ("current", "stale"):
            found = as_run(run.record, study.folder)
            found.current = run.state == "current"
            out[run.spec.name] = found
    return out


def repository_root(sweep_file: Path) -> Path:
    """The repository a sweep file belongs to (its documents' paths are from there)."""
    from experiments.studies.records import _repository_of

    return _repository_of(Path(sweep_file))


def write_documents(
    file: Path, runs_dir: Path | None, out: Path | None, only: str | None, runs_given: Path | None = None
) -> list[tuple[Path, int, int]]:
    """Write the sweep file's documents (or the one at `out` / of `only`); returns (path, finished, total) each."""
    sweep = read_sweep(file)
    study = study_state(file, sweep, say=lambda line: print(line, flush=True))
    recorded = recorded_runs(study)
    if out is not None or only is not None or not sweep.documents:
        target = out or Path("docs/results.md")
        command = (
            f"pflower results {shown_path(file)}"
            + (f" --runs {shown_path(runs_given)}" if runs_given else "")
            + (f" --out {shown_path(target)}" if target != Path("docs/results.md") else "")
            + (f" --only '{only}'" if only else "")
        )
        return [write_results(file, runs_dir, target, command, only, recorded)]
    root = repository_root(file)
    command = f"pflower results {shown_path(file)}"
    return [write_results(file, runs_dir, root / d.out, command, d.only, recorded) for d in sweep.documents]


def _compare(file: Path, study: StudyState, say: Callable[[str], None]) -> bool:
    """Regenerate each of the file's documents from its records alone into a scratch folder; say whether the
    committed one is the same; True when all are."""
    same = True
    recorded = recorded_runs(study)
    root = repository_root(file)
    for document in study.sweep.documents:
        committed = root / document.out
        with tempfile.TemporaryDirectory(prefix="pflower-check-") as tmp:
            scratch = Path(tmp) / document.out
            try:
                write_results(file, None, scratch, f"pflower results {shown_path(file)}", document.only, recorded)
                made = scratch.read_text()
            except ConfigError as exc:
                made = f"(none: {exc})"
        if not committed.is_file():
            say(f"  document {document.out}: not committed yet")
            same = False
        elif committed.read_text() != made:
            reason = made if made.startswith("(none") else "differs from what its records generate"
            say(f"  document {document.out}: {reason}; `pflower results {shown_path(file)}` writes it")
            same = False
        else:
            say(f"  document {document.out}: as its records generate it")
    return same


def check_studies(files: list[Path], say: Callable[[str], None]) -> int:
    """`pflower results --check`: every study file's state and documents; 1 when a committed document differs."""
    files = files or sorted(SWEEPS.glob("*.toml"))
    if not files:
        raise ConfigError(f"no sweep files given and none under {SWEEPS}")
    same = True
    studies = []
    for file in files:
        sweep = read_sweep(file)
        study = study_state(file, sweep, say=say)
        studies.append(study)
        for line in check_lines(study):
            say(line)
        same = _compare(file, study, say) and same
    for line in tier_lines(studies):
        say(line)
    say("check: every committed document is what its records generate" if same else "check: documents differ")
    return 0 if same else 1
