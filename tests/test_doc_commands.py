"""Every command the documents quote runs as written: `pflower` subcommands and their options exist, every
`python <script>.py` names a script of the repository, and every `flwr` command of the deployment recipes names the
deployment's connection (README.md, docs/, deploy/)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from experiments.cli import parser

from .conftest import REPO

DOCUMENTS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "deploy").glob("*.md")])
FENCE = re.compile(r"```[a-z]*\n(.*?)```", re.S)
INLINE = re.compile(r"`([^`]+)`")  # a span may wrap onto the next line


def _code(text: str, fenced_only: bool = False) -> list[str]:
    """The document's code: each line of its fenced blocks (continuations joined) and each inline span (not with
    `fenced_only`: the commands to copy, not the ones prose names)."""
    blocks = FENCE.findall(text)
    spans = [" ".join(s.split()) for s in INLINE.findall(FENCE.sub("", text)) if "\n\n" not in s]
    lines = []
    for block in blocks:
        lines += block.replace("\\\n", " ").splitlines()
    return lines if fenced_only else lines + spans


def _commands(marker: str, fenced_only: bool = False) -> list[tuple[str, str]]:
    """(document, the command from `marker` on) for every quoted line holding it."""
    found = []
    for doc in DOCUMENTS:
        for line in _code(doc.read_text(), fenced_only):
            for match in re.finditer(rf"(?:^|[\s;&|(]){re.escape(marker)}\s", line):
                found.append((str(doc.relative_to(REPO)), line[match.end() - len(marker) - 1 :].strip()))
    return found


def _options() -> dict[str, set[str]]:
    """Each subcommand's option strings."""
    sub = next(a for a in parser()._actions if a.dest == "command")
    return {name: set(p._option_string_actions) for name, p in sub.choices.items()}  # type: ignore[attr-defined]


def test_every_quoted_pflower_command_and_option_exists() -> None:
    options, bad = _options(), []
    commands = _commands("pflower")
    assert len(commands) > 20, "the documents quote pflower commands"
    for doc, command in commands:
        words = shlex.split(command.split("#")[0].split("|")[0].split("&&")[0], posix=True)
        if len(words) < 2 or words[1].startswith("<"):
            continue
        name = words[1]
        if name not in options:
            bad.append(f"{doc}: `{command}`: no subcommand {name!r}")
            continue
        bad += [
            f"{doc}: `{command}`: `pflower {name}` has no option {w.split('=')[0]}"
            for w in words[2:]
            if w.startswith("--") and w.split("=")[0] not in options[name]
        ]
    assert not bad, "\n".join(bad)


def test_every_quoted_python_script_exists() -> None:
    bad = []
    for doc, command in _commands("python") + _commands("python3"):
        words = command.split()
        script = words[1] if len(words) > 1 else ""
        if script.endswith(".py") and not (REPO / script).is_file():
            bad.append(f"{doc}: `{command}`: no script {script}")
    assert not bad, "\n".join(bad)


DEPLOYMENT_DOCUMENTS = ("deploy/", "docs/deployment.md")
CONNECTION = "deploy"  # the connection the recipes define in ~/.flwr/config.toml ([superlink.deploy])
VALUED = {"--run-id", "--format", "--run-config", "--federation-config", "--limit"}  # options followed by a value


def _positional(words: list[str]) -> list[str]:
    """The arguments that are neither options nor an option's value."""
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word.startswith("-"):
            skip = word in VALUED
        else:
            out.append(word)
    return out


def _flwr_words(command: str) -> list[str]:
    """A quoted `flwr ...` command's words from `flwr` on, without its comment (`docker compose run flwr flwr ...`:
    the service's name, then the command)."""
    words = shlex.split(command.split(" #")[0], posix=True)
    while words[1:2] == ["flwr"]:
        words = words[1:]
    return words


def test_every_deployment_flwr_command_names_its_connection() -> None:
    """Without it, `flwr ls --run-id ...` asks the local SuperLink, not the deployment's, and finds no such run."""
    bad, checked = [], 0
    for doc, command in _commands("flwr", fenced_only=True):
        if not doc.startswith(DEPLOYMENT_DOCUMENTS):
            continue
        words = _flwr_words(command)
        checked += 1
        if CONNECTION not in _positional(words[1:]):
            bad.append(f"{doc}: `{command}` names no connection (`{CONNECTION}`)")
    assert checked >= 8, "the deployment recipes quote flwr commands"
    assert not bad, "\n".join(bad)


def test_the_connection_check_would_catch_a_local_query(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "deploy").mkdir()
    doc = tmp_path / "deploy" / "README.md"
    doc.write_text("```bash\n" + "flwr run . deploy --stream\n" * 8 + "flwr ls --run-id RUN_ID --format json\n```\n")
    monkeypatch.setitem(globals(), "DOCUMENTS", [doc])
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    with pytest.raises(AssertionError, match="flwr ls --run-id RUN_ID --format json` names no connection"):
        test_every_deployment_flwr_command_names_its_connection()


@pytest.mark.parametrize("line", ["pflower sweep x.toml --nope", "pflower nope"])
def test_the_check_would_catch_a_stale_command(line: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(f"Run `{line}` and `pflower run --preset smoke`.\n" * 11)
    monkeypatch.setitem(globals(), "DOCUMENTS", [doc])
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    with pytest.raises(AssertionError, match="nope"):
        test_every_quoted_pflower_command_and_option_exists()


def _app_defaults() -> dict[str, object]:
    """The run config a `flwr run` starts from: pyproject.toml's [tool.flwr.app.config]."""
    import tomllib

    return dict(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])


def _flwr_run_configs() -> list[tuple[str, str, dict[str, object], bool]]:
    """(document, command, the run config the ServerApp gets, whether it runs on a deployment's SuperLink) of every
    quoted `flwr run` that sets a run config."""
    from flwr.common.config import parse_config_args

    found = []
    for doc, command in _commands("flwr", fenced_only=True):
        words = _flwr_words(command)
        if words[1:2] != ["run"]:
            continue
        given = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--run-config"]
        if not given or any("<" in g for g in given):  # none, or a placeholder such as <the same run config>
            continue
        config = {**_app_defaults(), **parse_config_args(given)}
        found.append((doc, command, config, CONNECTION in _positional(words[2:])))
    return found


def test_every_quoted_flwr_run_config_starts_its_server() -> None:
    """Each quoted `flwr run --run-config` parses as the ServerApp parses it, and a deployment's passes the check
    that refuses an unprotected run at its start (docs/deployment.md's DM-PFL line lacked max-weight-ratio: exit
    code 201 on a real SuperLink, while `flwr run --stream` itself exited 0)."""
    from common.config import parse_run_config
    from common.hparams import ConfigError
    from server_app.app import unprotected_deployment

    found, bad = _flwr_run_configs(), []
    assert len(found) >= 10 and sum(deployed for *_, deployed in found) >= 4, "the documents quote flwr runs"
    for doc, command, config, deployed in found:
        try:
            cfg = parse_run_config(config)
        except ConfigError as exc:
            bad.append(f"{doc}: `{command}`: {exc}")
            continue
        if deployed and (why := unprotected_deployment(cfg)):
            bad.append(f"{doc}: `{command}`: {why}")
    assert not bad, "\n".join(bad)


def test_every_quoted_pflower_run_and_sweep_parses_its_runs() -> None:
    """`pflower run ... --set K=V` and `pflower sweep FILE` as quoted: every run's config parses (a renamed key or a
    value out of range is caught here, not by a reader)."""
    from common.config import parse_run_config
    from common.hparams import ConfigError
    from experiments.run.presets import preset
    from experiments.run.runs import parse_assignment, parse_seeds, plan
    from experiments.run.sweep import read_sweep

    checked, bad = 0, []
    for doc, command in _commands("pflower"):
        words = shlex.split(command.split("#")[0].split("|")[0].split("&&")[0], posix=True)
        words = [w.replace("$PWD", str(REPO)).replace("$HOME", str(REPO)) for w in words]  # as a shell expands them
        if len(words) < 3 or any(w.startswith(("<", "KEY", "/path")) or w.isupper() for w in words[2:]):
            continue
        try:
            args = parser().parse_args(words[1:])
        except SystemExit:
            continue  # an option's value left for the reader to fill in: the option check covers the names
        try:
            if args.command == "run":
                config = dict(parse_assignment(item) for item in args.set)
                config.update({k: v for k, v in (("algorithm", args.algorithm), ("dataset", args.dataset)) if v})
                for spec in plan("doc", preset(args.preset), config, parse_seeds(args.seeds), args.clients):
                    parse_run_config(spec.run_config)
                checked += 1
            elif args.command == "sweep" and all((REPO / f).is_file() for f in args.file):
                for file in args.file:
                    read_sweep(REPO / file)
                checked += 1
        except ConfigError as exc:
            bad.append(f"{doc}: `{command}`: {exc}")
    assert checked >= 10, "the documents quote pflower runs and sweeps"
    assert not bad, "\n".join(bad)


def test_the_run_config_check_would_catch_an_unprotected_deployment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "deploy").mkdir()
    doc = tmp_path / "deploy" / "README.md"
    good = "flwr run . deploy --stream --run-config \"algorithm='dmpfl' max-weight-ratio=4 num-rounds=3\"\n"
    bad = "flwr run . deploy --stream --run-config \"algorithm='dmpfl' iterations=1 num-rounds=3\"\n"
    doc.write_text("```bash\n" + good * 9 + bad + "```\n")
    monkeypatch.setitem(globals(), "DOCUMENTS", [doc])
    monkeypatch.setitem(globals(), "REPO", tmp_path)
    (tmp_path / "pyproject.toml").write_text("[tool.flwr.app.config]\n")  # the keys' defaults: none given
    with pytest.raises(AssertionError, match="iterations=1 num-rounds=3.*max-weight-ratio"):
        test_every_quoted_flwr_run_config_starts_its_server()
