"""The papers' headline claims and their verdicts in a results document: a [[claim]] entry of a sweep file says
that row `a` is above (or below) row `b`, plus an optional `offset`, in one metric of one of its tables; the verdict
is `holds` or `fails` when the paired 95% interval over the seeds both rows ran excludes zero, else `undecided`
(with the budget that would decide it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from common.hparams import ConfigError
from experiments.analysis.collect import Group
from experiments.analysis.stats import fmt_ci, mean_ci, paired_difference
from experiments.analysis.tables import Column, TableSpec, best_companion, paper_column, row_values

CLAIM_KEYS = {"text", "table", "a", "b", "relation", "metric", "decide", "offset"}
RELATIONS = {">": "above", "<": "below"}
VERDICTS = ("holds", "fails beyond the seeds' noise", "undecided", "not run yet")


@dataclass(frozen=True)
class Claim:
    """'`a` relation `b` + `offset` in `metric`' over the runs of table `table` (`offset` in the metric's own units:
    -0.08 is 8 points of accuracy below `b`); `decide`: the budget that would decide it."""

    text: str
    table: str
    a: str
    b: str
    relation: str
    metric: str
    decide: str
    offset: float = 0.0


def parse_claim(raw: dict[str, Any], tables: dict[str, TableSpec], where: str) -> Claim:
    """One [[claim]] entry checked against the sweep's tables (ConfigError naming what is wrong)."""
    unknown = sorted(set(raw) - CLAIM_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(CLAIM_KEYS)}")
    for key in ("text", "table", "a", "b", "metric"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ConfigError(f"{where}: `{key}` must be a non-empty string")
    spec = tables.get(raw["table"])
    if spec is None:
        raise ConfigError(f"{where}: table {raw['table']!r} is not one of {sorted(tables)}")
    for key in ("a", "b"):
        if raw[key] not in spec.rows:
            raise ConfigError(f"{where}: {key} = {raw[key]!r} is not a row of table {spec.id!r}")
    relation = raw.get("relation", ">")
    if relation not in RELATIONS:
        raise ConfigError(f"{where}: relation must be one of {sorted(RELATIONS)}, not {relation!r}")
    offset = raw.get("offset", 0.0)
    if isinstance(offset, bool) or not isinstance(offset, (int, float)) or not math.isfinite(offset):
        raise ConfigError(f"{where}: `offset` must be a finite number, not {offset!r}")
    return Claim(
        raw["text"],
        raw["table"],
        raw["a"],
        raw["b"],
        relation,
        raw["metric"],
        str(raw.get("decide", "")).strip(),
        float(offset),
    )


def verdict(groups: list[Group], spec: TableSpec, claim: Claim) -> tuple[str, str]:
    """(verdict, the evidence: both rows' means and the paired difference in the claimed direction)."""
    column = paper_column(spec, Column(claim.metric, claim.metric))
    a = row_values(groups, spec, claim.a, column.metric)
    b = row_values(groups, spec, claim.b, column.metric)
    diff, half, n = paired_difference(a, b)
    if n == 0:
        return "not run yet", ""
    sign = 1.0 if claim.relation == ">" else -1.0
    toward = sign * (diff - claim.offset)
    if math.isfinite(half) and toward - half > 0:
        found = "holds"
    elif math.isfinite(half) and toward + half < 0:
        found = "fails beyond the seeds' noise"
    else:
        found = "undecided"
    scale, digits = (100.0, 2) if column.percent else (1.0, 3)
    shared = sorted(set(a) & set(b))
    mean_a, half_a, _ = mean_ci([a[s] for s in shared])
    mean_b, half_b, _ = mean_ci([b[s] for s in shared])
    evidence = (
        f"ours {claim.a} {fmt_ci(mean_a, half_a, scale, digits)} vs {claim.b} {fmt_ci(mean_b, half_b, scale, digits)}"
        f" ({', '.join(filter(None, (claim.metric, statistic_words(spec, column))))}), "
        f"{claim.a} - {claim.b} = {fmt_ci(diff, half, scale, digits)}"
        + (f" against {claim.offset * scale:+.{digits}f}" if claim.offset else "")
        + f" over {n} seed"
        + ("s" if n != 1 else "")
        + (" (one seed: no interval)" if n == 1 else "")
    )
    return found, evidence


def statistic_words(spec: TableSpec, column: Column) -> str:
    """Which round a verdict compares, and whose statistic that is ("" for a cost, counted over the whole run)."""
    if not column.percent:
        return ""
    if column.metric.startswith("max:"):
        return "its own best round" + (", the paper's statistic" if spec.compares_best else "")
    if column.metric.startswith("best:"):
        return "best round" + (", the paper's statistic" if spec.compares_best else "")
    if spec.paper_statistic == "last":
        return "last round, the paper's statistic"
    if spec.paper_statistic == "unknown" and best_companion(column) is not None:
        return "last round; the paper does not say which round it reports"
    return "last round"


def claim_lines(groups: list[Group], tables: list[TableSpec], claims: list[Claim]) -> list[str]:
    """The document's opening list: each claim with its verdict, the numbers, and for an undecided one the budget
    that would decide it."""
    if not claims:
        return []
    by_id = {t.id: t for t in tables}
    lines = ["## The papers' headline claims", ""]
    counts = dict.fromkeys(VERDICTS, 0)
    for claim in claims:
        found, evidence = verdict(groups, by_id[claim.table], claim)
        counts[found] += 1
        line = f"- **{found}**: {claim.text}" + (f"; {evidence}" if evidence else "")
        if found in ("undecided", "not run yet") and claim.decide:
            line += f". Decided by: {claim.decide}"
        lines.append(line + ".")
    summary = ", ".join(f"{n} {name}" for name, n in counts.items() if n)
    return lines + [
        "",
        f"Verdicts: {summary}. A verdict is `holds` or `fails` only where the paired 95% interval "
        "over seeds excludes zero.",
        "",
    ]
