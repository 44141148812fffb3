"""The `[[table]]` entries of a sweep file: which experiments a results table shows, the metrics of its columns,
the paper's numbers beside ours, and the paragraph on where they differ; each metric read from a finished run."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.hparams import ConfigError
from common.stopping import accuracy_curve, best_round
from common.storage.run_folder import evaluation_means, unseen_means
from experiments.analysis.collect import CORRUPT, Group, Run

TABLE_KEYS = {
    "id",
    "title",
    "source",
    "setting",
    "rows",
    "baseline",
    "columns",
    "paper",
    "sections",
    "figures",
    "notes",
    "round-rows",
    "paper-statistic",
    "best-round-columns",
}
STATISTICS = ("last", "best", "unknown")  # which round a paper's numbers come from (`paper-statistic`)
SECTIONS = ("overview", "paired", "shift", "unseen", "corruption", "domain", "stages")
FIGURES = ("shift", "corruption", "costs", "frontier", "attention", "mask-overlap", "global-rounds", "privacy")
FLOPS = ("flops", "flops-dense-grad")  # training FLOPs per client: weight gradients on updated positions / whole
MB = ("mb", "mb-all")  # MB per client: training messages / training and evaluation messages
RATIOS = {
    "mb-ratio": "mb",
    "mb-all-ratio": "mb-all",
    "flops-ratio": "flops",
    "flops-dense-grad-ratio": "flops-dense-grad",
}
ROUNDS = ("rounds", "best-round")  # counts of rounds: shown per seed, not as a mean
PLAIN = ("epsilon", "noise-multiplier")  # neither a percentage nor a cost: shown as it is
DOMAIN = re.compile(r"^domain-.+-acc$")


@dataclass(frozen=True)
class Column:
    """One compared quantity: its header, the metric it reads and whether it is a percentage."""

    label: str
    metric: str

    @property
    def percent(self) -> bool:
        """Accuracies are shown in %, costs and ratios as they are."""
        return self.metric not in (*MB, *FLOPS, *PLAIN) and self.metric not in RATIOS and self.metric not in ROUNDS


@dataclass(frozen=True)
class TableSpec:
    """A results table: rows (experiment names, an evaluation row's suffix allowed, e.g. 'mnist-dmpfl+'),
    columns, the paper's value per row and column (NaN: not reported) and the text around it."""

    id: str
    title: str
    source: str
    setting: str
    rows: tuple[str, ...]
    baseline: str | None
    columns: tuple[Column, ...]
    paper: dict[str, tuple[float, ...]]
    sections: tuple[str, ...]
    figures: tuple[str, ...]
    notes: str
    round_rows: tuple[str, ...] = ()  # the rows of the "global-rounds" figure
    paper_statistic: str = "unknown"  # the round the paper's numbers are from: last, best (over rounds), unknown
    best_round_columns: bool = True  # a best-round twin beside every last-round accuracy column

    @property
    def compares_best(self) -> bool:
        """Whether the paper's numbers, its order and its claims are compared with our best round."""
        return self.paper_statistic == "best"


def best_companion(column: Column, spec: TableSpec | None = None) -> Column | None:
    """The best-round twin of a last-round accuracy column (a final mean key such as 'acc-shift-0', or 'domains'):
    the mean over clients at the evaluation round with the best mean accuracy at shift 0; None for any other column
    and where the table `spec` shows that twin already."""
    if not column.percent or ":" in column.metric or column.metric == "corrupt":
        return None
    if spec is not None and not spec.best_round_columns:
        return None
    twin = Column(f"{column.label}, best round", f"best:{column.metric}")
    if spec is not None and any(c.metric == twin.metric for c in spec.columns):
        return None
    return twin


def paper_column(spec: TableSpec, column: Column) -> Column:
    """The column compared with the paper's number: the best-round twin where the paper reports the best round."""
    twin = best_companion(column, spec) if spec.compares_best else None  # twins off: the columns carry the statistic
    return twin or column


def row_experiment(row: str) -> str:
    """The experiment a row belongs to: 'mnist-dmpfl+' and 'mnist-dmpfl (global model)' -> 'mnist-dmpfl'."""
    return row.split("+")[0].split(" (")[0]


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where} must be a list of strings")
    return tuple(value)


def _choices(value: Any, allowed: tuple[str, ...], where: str) -> tuple[str, ...]:
    got = _strings(value, where)
    unknown = [v for v in got if v not in allowed]
    if unknown:
        raise ConfigError(f"{where}: unknown {unknown}; allowed: {', '.join(allowed)}")
    return got


def _check_row(row: str, experiments: dict[str, str], where: str) -> None:
    """A row names an experiment, or one of the evaluation rows its algorithm reports ('+', ' (cloud model)')."""
    from common.algorithms import SPECS

    experiment = row_experiment(row)
    if experiment not in experiments:
        raise ConfigError(f"{where}: row {row!r} names no experiment of the sweep")
    suffix, algorithm = row[len(experiment) :], experiments[experiment]
    if suffix and algorithm in SPECS:
        reported = [extra.suffix for extra in SPECS[algorithm].eval_rows]
        if suffix not in reported:
            raise ConfigError(
                f"{where}: row {row!r}: {algorithm} reports no {suffix.strip()!r} row"
                + (
                    f" (its extra rows: {', '.join(repr(r.strip()) for r in reported)})"
                    if reported
                    else " (it reports none)"
                )
            )


def parse_table(raw: dict[str, Any], experiments: dict[str, str], where: str) -> TableSpec:
    """One [[table]] entry checked against the sweep's experiments and their algorithms (ConfigError naming what
    is wrong)."""
    unknown = sorted(set(raw) - TABLE_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(TABLE_KEYS)}")
    table_id = raw.get("id")
    if not isinstance(table_id, str) or not table_id.replace("-", "").isalnum():
        raise ConfigError(f"{where}: `id` must be letters, digits and '-' (it names the figures' folder)")
    rows = _strings(raw.get("rows", []), f"{where} ({table_id}): rows")
    if not rows:
        raise ConfigError(f"{where} ({table_id}): no rows")
    for row in rows:
        _check_row(row, experiments, f"{where} ({table_id})")
    columns = []
    for index, col in enumerate(raw.get("columns", []), start=1):
        if not isinstance(col, dict) or not isinstance(col.get("label"), str) or not isinstance(col.get("metric"), str):
            raise ConfigError(f"{where} ({table_id}): column {index} needs a `label` and a `metric` string")
        columns.append(Column(col["label"], col["metric"]))
    paper: dict[str, tuple[float, ...]] = {}
    for row, values in dict(raw.get("paper", {})).items():
        if row not in rows:
            raise ConfigError(f"{where} ({table_id}): paper numbers for {row!r}, which is not one of its rows")
        if (
            not isinstance(values, list)
            or len(values) != len(columns)
            or not all(isinstance(v, (int, float)) for v in values)
        ):
            raise ConfigError(
                f"{where} ({table_id}): paper numbers for {row!r} must be {len(columns)} numbers "
                "(nan where the paper has none)"
            )
        paper[row] = tuple(float(v) for v in values)
    round_rows = _strings(raw.get("round-rows", []), f"{where} ({table_id}): round-rows")
    if strays := sorted(set(round_rows) - set(rows)):
        raise ConfigError(f"{where} ({table_id}): round-rows {strays} are not among its rows")
    baseline = raw.get("baseline")
    if baseline is not None and baseline not in rows:
        raise ConfigError(f"{where} ({table_id}): baseline {baseline!r} is not one of its rows")
    return TableSpec(
        table_id,
        str(raw.get("title", table_id)),
        str(raw.get("source", "")),
        str(raw.get("setting", "")),
        rows,
        baseline,
        tuple(columns),
        paper,
        _choices(raw.get("sections", ["overview"]), SECTIONS, f"{where} ({table_id}): sections"),
        _choices(raw.get("figures", []), FIGURES, f"{where} ({table_id}): figures"),
        str(raw.get("notes", "")).strip(),
        round_rows,
        _statistic(raw.get("paper-statistic", "unknown"), f"{where} ({table_id}): paper-statistic"),
        _flag(raw.get("best-round-columns", True), f"{where} ({table_id}): best-round-columns"),
    )


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: must be true or false")
    return value


def _statistic(value: Any, where: str) -> str:
    if value not in STATISTICS:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(STATISTICS)}")
    return str(value)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.nan


def _corruption_mean(run: Run, prefix: str, severity: str | None) -> float:
    values = [
        v
        for k, v in run.final.items()
        if k.startswith(prefix)
        and (m := CORRUPT.match(k[len(prefix) :]))
        and (severity is None or m.group(2) == severity)
    ]
    return sum(values) / len(values) if values else math.nan


def _domain_mean(run: Run) -> float:
    return _domain_mean_of(run.final)


def _round_maximum(run: Run, read: Callable[[dict[str, float]], float]) -> float:
    """The largest value `read` gives over the run's evaluation rounds (NaN without one)."""
    values = [v for r in run.records if (means := evaluation_means(r)) and math.isfinite(v := read(means))]
    return max(values) if values else math.nan


def _domains(means: dict[str, float]) -> set[str]:
    return {k for k in means if DOMAIN.match(k)}


def _domain_mean_of(means: dict[str, float], keys: set[str] | None = None) -> float:
    """The mean over the domain keys (those of `keys` when given: NaN for a round that lacks one of them, so a
    round that evaluated fewer domains cannot pass for the best)."""
    keys = _domains(means) if keys is None else keys
    if not keys or not keys <= set(means):
        return math.nan
    return sum(means[k] for k in keys) / len(keys)


def metric_reader(metric: str, prefix: str = "") -> Callable[[Run], float]:
    """A function run -> value of `metric` for an evaluation row with metric-key `prefix`:
    a final mean key ('acc-shift-0'), 'best:<key>' (the best evaluation round; 'best:domains' too), 'max:<key>'
    (the key's largest mean over the evaluation rounds, each key its own round, as a paper's per-domain maxima;
    'max:domains' too), 'std:<key>' (client spread),
    'unseen:<key>' (held-out clients), 'stage:<stage>:<acc_local|acc_global|acc>', 'corrupt' or 'corrupt:<s>'
    (mean over corruptions, at one severity), 'domains' (mean over the domain-<d>-acc keys: DapperFL's global
    accuracy), 'mb', 'flops' (per client, training), 'mb-all' (training and evaluation), 'flops-dense-grad' (the
    same with whole weight gradients of masked layers), 'rounds' (rounds run: fewer than num-rounds when
    stop-patience ended the run), 'best-round' (the round of the best mean accuracy at shift 0), 'epsilon' (the
    run's differential-privacy epsilon at its `dp-delta`; NaN without `dp`) or 'noise-multiplier' (its z)."""
    kind, _, rest = metric.partition(":")
    if metric == "epsilon":
        return lambda run: _number((run.summary.get("dp") or {}).get("epsilon"))
    if metric == "noise-multiplier":
        return lambda run: _number((run.summary.get("dp") or {}).get("noise_multiplier"))
    if metric == "rounds":
        return lambda run: _number(run.summary.get("rounds_completed"))
    if metric == "best-round":  # the round 'best:' reads: the run's main accuracy's best, for its every row
        return lambda run: _number(best_round(accuracy_curve(run.records)))
    if metric == "mb":
        return lambda run: run.mb_per_client
    if metric == "mb-all":
        return lambda run: run.mb_all_per_client
    if metric == "flops":
        return lambda run: run.flops_per_client
    if metric == "flops-dense-grad":
        return lambda run: run.flops_dense_grad_per_client
    if kind == "max":  # each key its own best evaluation round (a paper's per-domain maxima)
        if rest == "domains":
            return lambda run: _round_maximum(run, lambda means: _domain_mean_of(means, _domains(run.final)))
        return lambda run: _round_maximum(run, lambda means: _number(means.get(prefix + rest)))
    if kind == "best" and rest == "domains":
        return lambda run: _domain_mean_of(run.best_round())
    if kind == "best":
        return lambda run: _number(run.best_round().get(prefix + rest))
    if kind == "std":
        return lambda run: _number(run.final_std.get(prefix + rest))
    if kind == "unseen":
        return lambda run: _number(unseen_means(run.summary).get(prefix + rest))
    if kind == "stage":
        stage, _, key = rest.partition(":")
        return lambda run: _number(((run.summary.get("stages") or {}).get(stage, {}).get(key) or [math.nan])[0])
    if metric == "domains":
        return lambda run: _domain_mean(run)
    if kind == "corrupt":
        return lambda run: _corruption_mean(run, prefix, rest or None)
    return lambda run: _number(run.final.get(prefix + metric))


def find_row(groups: list[Group], row: str) -> tuple[Group, str] | None:
    """The group of a row name and its evaluation row's metric prefix ('' for the main row); None if not run."""
    from common.algorithms import SPECS

    for group in groups:
        if row == group.label:
            return group, ""
        for extra in SPECS[group.algorithm].eval_rows if group.algorithm in SPECS else ():
            if row == group.label + extra.suffix:
                return group, extra.prefix
    return None


def row_values(groups: list[Group], spec: TableSpec, row: str, metric: str) -> dict[int, float]:
    """seed -> the row's value of `metric` (ratios: to the table's baseline run of the same seed)."""
    found = find_row(groups, row)
    if found is None:
        return {}
    group, prefix = found
    if metric in RATIOS:
        base = find_row(groups, spec.baseline) if spec.baseline else None
        if base is None:
            return {}
        read = metric_reader(RATIOS[metric])
        reference = base[0].by_seed(read)
        return {s: v / reference[s] for s, v in group.by_seed(read).items() if reference.get(s)}
    return group.by_seed(metric_reader(metric, prefix))
