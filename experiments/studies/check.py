"""`pflower results --check`: for every study file what is missing or stale, with the hours to make it, and whether
each committed document (the study's own and the headline table) is what its records generate."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from experiments.analysis.results_doc import shown_path
from experiments.run.sweep import read_sweep
from experiments.studies.documents import recorded_runs, study_files, write_document
from experiments.studies.headline import HEADLINE, headline_markdown, headline_studies
from experiments.studies.records import repository_root
from experiments.studies.status import StudyState, check_lines, study_state, tier_lines


def compare_documents(file: Path, study: StudyState, say: Callable[[str], None]) -> bool:
    """Regenerate each of the file's documents from its records alone into a scratch folder; say whether the
    committed one is the same; True when all are."""
    same = True
    recorded = recorded_runs(study)
    root = repository_root(file)
    for document in study.sweep.documents:
        committed = root / document.out
        with tempfile.TemporaryDirectory(prefix="pflower-check-") as tmp:
            scratch = Path(tmp) / "repo" / document.out
            write_document(file, study, None, scratch, document.only, recorded, document.out)
            made = scratch.read_text()
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


def compare_headline(studies: list[StudyState], say: Callable[[str], None]) -> bool:
    """Say whether the committed headline table is what every study file's records generate; True when it is."""
    committed = repository_root(studies[0].sweep_file) / HEADLINE
    if committed.is_file() and committed.read_text() == headline_markdown(headline_studies(studies, say)):
        say(f"  document {HEADLINE.as_posix()} (the headline table): as the records generate it")
        return True
    say(f"  document {HEADLINE.as_posix()} (the headline table): differs; `pflower results --headline` writes it")
    return False


def check_studies(files: list[Path], say: Callable[[str], None]) -> int:
    """`pflower results --check`: every study file's state and documents; 1 when a committed document differs."""
    files = files or study_files()
    same = True
    studies = []
    for file in files:
        sweep = read_sweep(file)
        study = study_state(file, sweep, say=say)
        studies.append(study)
        for line in check_lines(study):
            say(line)
        same = compare_documents(file, study, say) and same
    for line in tier_lines(studies):
        say(line)
    same = compare_headline(studies, say) and same
    say("check: every committed document is what its records generate" if same else "check: documents differ")
    return 0 if same else 1
