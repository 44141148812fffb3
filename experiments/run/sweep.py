"""A sweep: a TOML file of experiments, each run for every seed one after another; finished runs are kept and
skipped, a run stopped midway resumes from its checkpoint, progress and ETA cover the whole sweep."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import Path

from common.config import RunConfig
from common.hparams import ConfigError
from experiments.analysis.claims import Claim, parse_claim
from experiments.analysis.tables import TableSpec, parse_table, row_experiment
from experiments.run.launchers import check_engine
from experiments.run.presets import preset
from experiments.run.runs import (
    SUPERSEDED_FOLDER,
    RunResult,
    RunSpec,
    changed_settings,
    folder_name,
    parse_seeds,
    plan,
    run_state,
    set_aside,
    stopped_line,
)

TOP_KEYS = {
    "name",
    "title",
    "preset",
    "seeds",
    "engine",
    "defaults",
    "groups",
    "experiment",
    "table",
    "claim",
    "document",
    "tier",
}
DEFAULT_TIER = 3  # a study's priority when its file names none: made after tiers 1 and 2
EXPERIMENT_KEYS = {"name", "preset", "seeds", "clients", "group", "hours", "tier"}  # besides run-config keys


@dataclass(frozen=True)
class Sweep:
    """A sweep file read: its name, runs, [[table]] and [[claim]] entries and the engine it asks for (None: the
    CLI's default)."""

    name: str
    specs: list[RunSpec]
    tables: list[TableSpec]
    engine: str | None = None
    claims: list[Claim] = field(default_factory=list)
    title: str = "Results: the seed papers' comparisons on this implementation"  # of its results document
    hours: dict[str, float] = field(default_factory=dict)  # experiment -> estimated hours a run (`hours`)
    documents: list[Document] = field(default_factory=list)  # the documents generated from its records
    tiers: dict[str, int] = field(default_factory=dict)  # experiment -> its study priority (`tier`; 1 first)


@dataclass(frozen=True)
class Document:
    """A results document a sweep file's records make ([[document]]: `out`, the markdown's path from the
    repository's root, and `only`, the experiments it covers, as `pflower results --only`)."""

    out: str
    only: str | None = None


def load_sweep(path: Path) -> tuple[str, list[RunSpec]]:
    """The sweep's name and its runs in order (experiments x seeds), every run config checked up front."""
    sweep = read_sweep(path)
    return sweep.name, sweep.specs


def read_sweep(path: Path) -> Sweep:
    """The sweep's name, its runs, its [[table]] entries (each table's rows checked against the experiments and the
    evaluation rows of their algorithms) and its engine."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"sweep file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"sweep file {path} is not valid TOML: {exc}") from None
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise ConfigError(f"sweep file {path}: unknown top-level key(s) {unknown}; allowed: {sorted(TOP_KEYS)}")
    folder = sweep_name(path, raw.get("name"))
    experiments = raw.get("experiment", [])
    if not isinstance(experiments, list) or not experiments:
        raise ConfigError(f"sweep file {path} has no [[experiment]] tables")
    defaults = dict(raw.get("defaults", {}))
    groups = raw.get("groups", {})
    if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
        raise ConfigError(f"sweep file {path}: [groups.<name>] must be tables of run-config keys")
    specs: list[RunSpec] = []
    hours: dict[str, float] = {}
    tiers: dict[str, int] = {}
    algorithms: dict[str, str] = {}  # experiment -> algorithm, for the tables' rows
    for index, entry in enumerate(experiments, start=1):
        name = entry.get("name")
        if name is None or name == "":
            raise ConfigError(f"sweep file {path}: experiment {index} has no name")
        folder_name(name, f"sweep file {path}: experiment {index}: name")
        if name in algorithms:
            raise ConfigError(f"sweep file {path}: two experiments are named {name!r}")
        group = entry.get("group")
        if group is not None and group not in groups:
            raise ConfigError(
                f"sweep file {path}: experiment {name}: group {group!r} is not one of [groups.*]: "
                f"{', '.join(sorted(groups)) or 'none defined'}"
            )
        own = {**groups.get(group, {}), **entry}  # the group's keys, the experiment's over them
        config = {**defaults, **{k: v for k, v in own.items() if k not in EXPERIMENT_KEYS}}
        seeds = parse_seeds(own.get("seeds", raw.get("seeds", [0])))
        clients = own.get("clients")
        if clients is not None and (not isinstance(clients, int) or clients < 1):
            raise ConfigError(f"sweep file {path}: experiment {name}: clients must be a positive integer")
        specs.extend(plan(name, preset(own.get("preset", raw.get("preset", "smoke"))), config, seeds, clients))
        algorithms[name] = str(config.get("algorithm", RunConfig().algorithm))
        if "hours" in own:
            hours[name] = _hours(own["hours"], f"sweep file {path}: experiment {name}")
        tiers[name] = _tier(own.get("tier", raw.get("tier", DEFAULT_TIER)), f"sweep file {path}: experiment {name}")
    tables = [
        parse_table(table, algorithms, f"sweep file {path}: table {index}")
        for index, table in enumerate(raw.get("table", []), start=1)
    ]
    by_id = {t.id: t for t in tables}
    claims = [
        parse_claim(claim, by_id, f"sweep file {path}: claim {index}")
        for index, claim in enumerate(raw.get("claim", []), start=1)
    ]
    engine = raw.get("engine")
    if engine is not None:
        engine = check_engine(str(engine))
    title = raw.get("title", Sweep.title)
    if not isinstance(title, str) or not title.strip():
        raise ConfigError(f"sweep file {path}: `title` must be a non-empty string")
    documents = [_document(d, f"sweep file {path}: document {i}") for i, d in enumerate(raw.get("document", []), 1)]
    return Sweep(folder, specs, tables, engine, claims, title.strip(), hours, documents, tiers)


def _tier(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 9:
        raise ConfigError(f"{where}: `tier` (the study's priority, 1 first) must be a whole number from 1 to 9")
    return value


def _hours(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{where}: `hours` (the estimated hours of one run on 2 CPU cores) must be a positive number")
    return float(value)


def _document(raw: object, where: str) -> Document:
    if not isinstance(raw, dict) or set(raw) - {"out", "only"} or not isinstance(raw.get("out"), str):
        raise ConfigError(f"{where}: a [[document]] has `out` (a markdown path) and optionally `only` (experiments)")
    out = str(raw["out"])
    if Path(out).is_absolute() or ".." in Path(out).parts or not out.endswith(".md"):
        raise ConfigError(f"{where}: `out` {out!r} must be a relative .md path inside the repository")
    only = raw.get("only")
    if only is not None and not isinstance(only, str):
        raise ConfigError(f"{where}: `only` must be a string of experiment names or globs")
    return Document(out, only)


def sweep_name(path: Path, name: object) -> str:
    """The sweep's `name` (default: the file's stem), checked to be one plain folder name (results/<name>)."""
    if name is None:
        return folder_name(Path(path).stem, f"sweep file {path}: no `name`, so its file name", plus=True)
    return folder_name(name, f"sweep file {path}: name", plus=True)


def load_tables(path: Path) -> list[TableSpec]:
    """The [[table]] entries of a sweep file, in order (ConfigError when it has none)."""
    return check_tables(path, read_sweep(path).tables)


def check_tables(path: Path, tables: list[TableSpec]) -> list[TableSpec]:
    """A results document's tables: at least one, each id once (ConfigError otherwise)."""
    if not tables:
        raise ConfigError(f"sweep file {path} has no [[table]] entries: nothing to put in a results document")
    ids = [t.id for t in tables]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"sweep file {path}: two tables share an id")
    return tables


def only_names(only: str) -> list[str]:
    """The names and globs of an --only value ('a,b*' -> ['a', 'b*'])."""
    return [p.strip() for p in only.split(",") if p.strip()]


def narrow(sweep: Sweep, only: str, option: str = "--only") -> Sweep:
    """The sweep narrowed to the experiments `only` names (comma-separated names or shell globs such as
    'fedampx-*', each matching at least one): their runs, the tables' rows of theirs (a table left with none is
    dropped) and the claims that compare two of them."""
    patterns = only_names(only)
    if not patterns:
        raise ConfigError(f"{option} needs experiment names or globs, e.g. {option} 'fedampx-*,path-fliu'")
    names = list(dict.fromkeys(s.experiment for s in sweep.specs))
    unmatched = [p for p in patterns if not any(fnmatchcase(n, p) for n in names)]
    if unmatched:
        listed = ", ".join(names[:10]) + (f" (+{len(names) - 10} more)" if len(names) > 10 else "")
        missing = ", ".join(unmatched)
        raise ConfigError(f"{option}: {missing} names no experiment of the sweep; its experiments: {listed}")
    keep = {n for n in names if any(fnmatchcase(n, p) for p in patterns)}
    tables = []
    for table in sweep.tables:
        rows = tuple(r for r in table.rows if row_experiment(r) in keep)
        if rows:
            tables.append(
                replace(
                    table,
                    rows=rows,
                    baseline=table.baseline if table.baseline in rows else None,
                    paper={r: v for r, v in table.paper.items() if r in rows},
                    round_rows=tuple(r for r in table.round_rows if r in rows),
                )
            )
    ids = {t.id for t in tables}
    claims = [c for c in sweep.claims if c.table in ids and row_experiment(c.a) in keep and row_experiment(c.b) in keep]
    return replace(sweep, specs=[s for s in sweep.specs if s.experiment in keep], tables=tables, claims=claims)


def document_sweep(path: Path, only: str | None = None) -> Sweep:
    """A sweep file read for its results document: narrowed to the experiments `only` names, with at least one
    table (ConfigError otherwise, before anything runs)."""
    sweep = read_sweep(path)
    if only:
        sweep = narrow(sweep, only)
        if not sweep.tables:
            raise ConfigError(f"--only {only}: none of these experiments is a row of {path}'s tables")
    check_tables(path, sweep.tables)
    return sweep


def shard(specs: list[RunSpec], text: str) -> list[RunSpec]:
    """The K-th of N interleaved shares of a sweep's runs ('K/N', K from 1): runs K, K+N, K+2N, ... of the file's
    order, so that N sweeps on one results folder never run the same run and each gets every experiment's seeds."""
    index, sep, count = text.partition("/")
    try:
        k, n = int(index), int(count)
    except ValueError:
        k = n = 0
    if not sep or n < 1 or not 1 <= k <= n:
        raise ConfigError(f"--shard {text!r} must be K/N with 1 <= K <= N, e.g. --shard 1/2")
    return specs[k - 1 :: n]


def check_kept_runs(
    specs: list[RunSpec], out_dir: Path, replace: bool = False, say: Callable[[str], None] = print, source: str = ""
) -> None:
    """Clear the way for runs whose kept folder under out_dir was made with other settings than `source` (the sweep
    file, or the command line) asks now: an unfinished one (failed, interrupted) is set aside with one line, so a
    retry with fixed inputs starts anew; a finished one only with `replace`, else ConfigError naming it, since
    mixing settings would put two of them in one table. A folder a live run holds is never touched."""
    source = source or "the sweep file"
    changed = [(s, diff) for s in specs if (diff := changed_settings(s, out_dir / s.name))]
    live = [s.name for s, _ in changed if run_state(out_dir / s.name) == "running"]
    if live:
        raise ConfigError(f"{', '.join(live)} under {out_dir}: running now with other settings; stop it first")
    refused = [(s, diff) for s, diff in changed if run_state(out_dir / s.name) == "finished" and not replace]
    if refused:
        lines = [
            f"  {out_dir / spec.name}: {', '.join(diff[:4])}" + (f" (+{len(diff) - 4} more)" if len(diff) > 4 else "")
            for spec, diff in refused[:8]
        ]
        more = f"\n  ... and {len(refused) - 8} more" if len(refused) > 8 else ""
        raise ConfigError(
            f"{len(refused)} finished run(s) were made with other settings than {source} now asks; --replace sets "
            f"them aside (under {out_dir / SUPERSEDED_FOLDER}) and makes them again, or name the experiment anew:\n"
            + "\n".join(lines)
            + more
        )
    for spec, diff in changed:
        state = run_state(out_dir / spec.name)
        aside = set_aside(out_dir / spec.name)
        say(f"set aside: {spec.name} ({state}, made with {', '.join(diff[:2])}) -> {aside}; it runs anew")


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def run_sweep(
    specs: list[RunSpec],
    out_dir: Path,
    execute: Callable[[RunSpec], RunResult],
    say: Callable[[str], None],
    label: str = "sweep",
) -> list[RunResult]:
    """Run every spec not finished yet, in order, saying before each what is done and the ETA of the rest."""
    pending = [s for s in specs if run_state(out_dir / s.name) != "finished"]
    done_before = len(specs) - len(pending)
    say(
        f"{label}: {len(specs)} runs, {done_before} finished earlier (kept), {len(pending)} to run; "
        f"results in {out_dir}"
    )
    results: list[RunResult] = []
    spent: list[float] = []
    for index, spec in enumerate(pending, start=1):
        eta = f"ETA {_clock(sum(spent) / len(spent) * (len(pending) - index + 1))}" if spent else "ETA after this run"
        resumed = " (resumes from its checkpoint)" if run_state(out_dir / spec.name) == "resumable" else ""
        say(f"[{label} {done_before + index}/{len(specs)}] {spec.experiment} seed {spec.seed}{resumed}; {eta}")
        try:
            result = execute(spec)
        except KeyboardInterrupt:  # Ctrl+C or SIGTERM: say where the run stands, then unwind to the exit status
            say(f"[{label} {done_before + index}/{len(specs)}] {stopped_line(out_dir / spec.name)}")
            raise
        results.append(result)
        spent.append(result.seconds)
        outcome = "finished" if result.status == "finished" else f"FAILED: {result.reason} (log: {result.log})"
        say(f"[{label} {done_before + index}/{len(specs)}] {spec.name} {outcome} in {_clock(result.seconds)}")
    return results


def summary_line(results: list[RunResult], total: int, label: str = "sweep") -> tuple[str, bool]:
    """The sweep's last line and whether every run finished."""
    failed = [r for r in results if r.status == "failed"]
    if failed:
        return (
            f"{label}: {len(failed)} of {total} runs failed: "
            + ", ".join(r.spec.name for r in failed)
            + "; run the same command again to retry them (finished runs are kept)",
            False,
        )
    return f"{label}: all {total} runs finished", True
