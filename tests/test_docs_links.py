"""Documentation links: every relative link in README.md, docs/ and deploy/ reaches a file (and heading); no network."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from .conftest import REPO

README_MAX_LINES = 250
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)]*)\)")
TITLE = re.compile(r"\s+\"[^\"]*\"$")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
AUTOLINK = re.compile(r"<(https?://[^>\s]+)>")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def markdown_files(repo: Path) -> list[Path]:
    """README.md, docs/**/*.md and deploy/*.md of a checkout."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md")), *sorted((repo / "deploy").glob("*.md"))]


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"(`+).*?\1", "", line))
    return lines


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text, lowercased, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file, numbered as GitHub numbers repeats (-1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            slug = github_slug(match.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def link_targets(text: str) -> list[str]:
    """Every link target of a markdown text (inline, images, reference definitions, autolinks), outside code."""
    prose = "\n".join(_prose_lines(text))
    inline = [TITLE.sub("", target.strip()).strip("<>") for target in INLINE_LINK.findall(prose)]
    return inline + REFERENCE_DEFINITION.findall(prose) + AUTOLINK.findall(prose)


def link_problems(path: Path, repo: Path) -> list[str]:
    """One line per broken link of a markdown file: a missing file, a missing anchor, a malformed web address."""
    problems = []
    for target in link_targets(path.read_text()):
        where = f"{path.relative_to(repo)}: {target}"
        parts = urlsplit(target)
        if parts.scheme in ("http", "https"):
            if not re.fullmatch(r"[A-Za-z0-9.-]+\.[A-Za-z]{2,}(:\d+)?", parts.netloc) or " " in target:
                problems.append(f"{where}: malformed web address")
            continue
        if parts.scheme:
            if parts.scheme != "mailto":
                problems.append(f"{where}: unexpected scheme")
            continue
        file = (path.parent / unquote(parts.path)).resolve() if parts.path else path
        if not file.exists():
            problems.append(f"{where}: no such file")
        elif parts.fragment and file.suffix == ".md" and unquote(parts.fragment) not in anchors(file):
            problems.append(f"{where}: no heading with that anchor in {file.name}")
    return problems


def test_every_documentation_link_resolves() -> None:
    problems = [line for path in markdown_files(REPO) for line in link_problems(path, REPO)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_stays_a_first_screen() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


def test_readme_keeps_the_quick_start_commands() -> None:
    text = (REPO / "README.md").read_text()
    assert 'pip install -e ".[study]" && pflower run --preset quickstart --engine simulation\n' in text
    assert 'pip install -e ".[test]" && ruff check . && ruff format --check . && mypy && python -m pytest -q' in text


def test_mkdocs_nav_lists_every_docs_page() -> None:
    nav = re.findall(r"^\s*-\s*[^:\n]+:\s*(\S+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), re.MULTILINE)
    pages = sorted(path.relative_to(REPO / "docs").as_posix() for path in (REPO / "docs").rglob("*.md"))
    assert sorted(nav) == pages, "mkdocs.yml's nav and docs/**/*.md differ"


@pytest.mark.parametrize(
    ("link", "problem"),
    [
        ("[gone](docs/missing.md)", "no such file"),
        ("[gone](docs/page.md#no-such-heading)", "no heading with that anchor"),
        ("[gone](#nowhere)", "no heading with that anchor"),
        ("[web](https://exa mple.org/x)", "malformed web address"),
        ("[web](https://localhost)", "malformed web address"),
    ],
)
def test_a_broken_link_is_reported(tmp_path: Path, link: str, problem: str) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## The `pflower` command: `run | sweep`\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nSee [page](docs/page.md#the-pflower-command-run--sweep) and {link}.\n")
    problems = link_problems(readme, tmp_path)
    assert len(problems) == 1 and problem in problems[0], problems


def test_links_inside_code_are_not_links(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# T\n\n```\n[x](missing.md)\n```\n\n`[y](missing.md)`\n")
    assert link_problems(readme, tmp_path) == []


def test_github_slugs() -> None:
    assert github_slug("Clients that never trained (`holdout-clients`)") == "clients-that-never-trained-holdout-clients"
    assert github_slug("Split baselines: LG-FedAvg, FedPer") == "split-baselines-lg-fedavg-fedper"
    assert github_slug("Running with `flwr run` directly") == "running-with-flwr-run-directly"


MACHINE_PATH = re.compile(r"(?<![\w.~/])/(?:root|home|work|tmp/pytest-of-[\w-]+)/")


def test_no_committed_document_names_a_path_of_the_machine_that_wrote_it() -> None:
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}"
        for path in markdown_files(REPO)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if MACHINE_PATH.search(line)
    ]
    assert not found, "absolute paths of a machine in committed documents:\n" + "\n".join(found)
