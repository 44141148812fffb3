"""summary.md: the run's accuracy at each shift degree, its other tables, costs and replies."""

from __future__ import annotations

import math

from common.algorithms import FINETUNED, eval_rows
from common.data.domains import DOMAINS
from common.learning.evaluate import shift_key
from common.storage.run_folder import (
    Evaluation,
    FinalEvaluation,
    Summary,
    final_evaluation,
    final_means,
    unseen_evaluation,
)

from ..replies import domain_key
from .shift import corruption_lines, domain_shift_lines


def _fmt(value: float, pct: bool = True) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.2f}" if pct else f"{value:.3f}"


def _stage_lines(summary: Summary) -> list[str]:
    stages = summary.get("stages")
    if not stages:
        return []
    eps = sorted({e for row in stages.values() for e in row["rho"]}, key=float)
    lines = [
        f"Stages (FLIU) of the clients trained in round {summary['stages_round']}: Acc(L) on the client's own "
        "test split, Acc(G) on the pooled test set, Acc = Acc(L) + Acc(G) (%, mean +/- std); "
        "rho_eps = clients with Acc(L) > eps.",
        "",
        "| stage | Acc(L) | Acc(G) | Acc | " + " | ".join(f"rho_{e}" for e in eps) + " |",
        "|---|---|---|---|" + "---|" * len(eps),
    ]
    for stage, row in stages.items():
        cells = [f"{_fmt(row[k][0])} +/- {_fmt(row[k][1])}" for k in ("acc_local", "acc_global", "acc")]
        lines.append(
            f"| {stage} | "
            + " | ".join(cells)
            + " | "
            + " | ".join(f"{row['rho'].get(e, 0)}/{row['clients']}" for e in eps)
            + " |"
        )
    return lines + [""]


def _degree_cells(stats: FinalEvaluation | Evaluation, prefix: str, degrees: list[float]) -> list[str]:
    """'mean +/- std' (%) of a row of evaluation statistics at each shift degree."""
    return [
        f"{_fmt(stats['mean'][prefix + shift_key(d)])} +/- {_fmt(stats['std'][prefix + shift_key(d)])}" for d in degrees
    ]


def _unseen_lines(summary: Summary) -> list[str]:
    """Held-out clients: the newcomer model's accuracy as received and after fine-tuning, by shift degree."""
    unseen, degrees = unseen_evaluation(summary), summary["shift_degrees"]
    if not unseen:
        return []
    lines = [
        f"Held-out clients ({unseen['num_clients']}, never trained; {unseen['failed']} failed): the model a new "
        "client receives, as received and after local fine-tuning (%, mean +/- std):",
        "",
        "| unseen clients | " + " | ".join(f"{100 * d:g}%" for d in degrees) + " |",
        "|---|" + "---|" * len(degrees),
    ]
    for prefix, label in (("", "as received"), (FINETUNED.prefix, FINETUNED.label)):
        if prefix + shift_key(degrees[0]) in unseen["mean"]:
            lines.append(f"| {label} | " + " | ".join(_degree_cells(unseen, prefix, degrees)) + " |")
    return lines + [""]


def _domain_lines(summary: Summary) -> list[str]:
    """Multi-domain data: the global model's accuracy on each domain's held-out test data, and their mean."""
    final = final_means(summary)
    rows = [(name, final[domain_key(name)]) for name in DOMAINS if domain_key(name) in final]
    if not rows:
        return []
    mean = sum(value for _, value in rows) / len(rows)
    return [
        "Global model on each domain's held-out test data (%), and their mean (global accuracy):",
        "",
        "| " + " | ".join(name for name, _ in rows) + " | global accuracy |",
        "|---" * (len(rows) + 1) + "|",
        "| " + " | ".join(_fmt(value) for _, value in rows) + f" | {_fmt(mean)} |",
        "",
    ]


def _ratio_lines(summary: Summary) -> list[str]:
    """DapperFL: costs per client by pruning ratio."""
    table = summary.get("by_ratio")
    if not table:
        return []
    lines = [
        "Per client and round, by pruning ratio (measured):",
        "",
        "| ratio | clients | values uploaded | training FLOPs | MB up | MB down |",
        "|---|---|---|---|---|---|",
    ]
    for ratio, row in sorted(table.items(), key=lambda item: float(item[0])):
        lines.append(
            f"| {ratio} | {len(row['clients'])} | {row['values']:,} | {row['train_flops']:.3e} | "
            f"{row['mb_up']:.3f} | {row['mb_down']:.3f} |"
        )
    return lines + [""]


def render_markdown(summary: Summary) -> str:
    """summary.md: one table of accuracy at each shift degree, then costs and replies."""
    lines = [f"# {summary.get('algorithm', '?')} on {summary.get('dataset', '?')}", ""]
    lines.append(
        f"{summary.get('num_clients')} clients, partition {summary.get('partition')}, "
        f"{summary['rounds_completed']} rounds, seed {summary.get('seed')}."
    )
    stopped = summary.get("stopped_early")
    if stopped:
        lines.append(
            f"Stopped early after round {stopped['round']}: the best mean accuracy (round {summary.get('best_round')}) "
            f"rose by no more than {100 * stopped['min_delta']:g} points in its last {stopped['patience']} rounds "
            "(stop-patience)."
        )
    if summary.get("resumed_after_rounds"):
        lines.append(
            f"Stopped and resumed from its checkpoint after round(s) "
            f"{', '.join(map(str, summary['resumed_after_rounds']))}."
        )
    lines.append("")
    final = final_evaluation(summary)
    if final:
        degrees = summary["shift_degrees"]
        lines.append(
            f"Accuracy (%) of the {final['num_clients']} evaluated clients after round "
            f"{summary['final_round']}: mean +/- std across clients, by test-time shift degree."
        )
        lines.append("")
        lines.append("| shift | " + " | ".join(f"{100 * d:g}%" for d in degrees) + " |")
        lines.append("|---|" + "---|" * len(degrees))
        for prefix, label in [("", "accuracy")] + [(row.prefix, row.label) for row in eval_rows()]:
            if prefix + shift_key(degrees[0]) not in final["mean"]:
                continue
            lines.append(f"| {label} | " + " | ".join(_degree_cells(final, prefix, degrees)) + " |")
        lines.append("")
        lines.append(f"Best mean accuracy without shift over rounds: {_fmt(summary['best_mean_accuracy'])}%.")
    else:
        lines.append("No evaluation ran.")
    lines.append("")
    lines.extend(corruption_lines(summary))
    lines.extend(_stage_lines(summary))
    lines.extend(_unseen_lines(summary))
    mb = summary["mb_per_client"]
    lines.extend(_domain_lines(summary))
    lines.extend(domain_shift_lines(summary))
    lines.extend(_ratio_lines(summary))
    lines.append("| cost | value |")
    lines.append("|---|---|")
    lines.append(f"| training download per client (MB, measured) | {mb['train_down']:.3f} |")
    lines.append(f"| training upload per client (MB, measured) | {mb['train_up']:.3f} |")
    lines.append(f"| evaluation download per client (MB) | {mb['eval_down']:.3f} |")
    lines.append(f"| training FLOPs per client | {summary['train_flops_per_client']:.3e} |")
    lines.append(f"| wall time (s) | {summary['wall_seconds']:.1f} |")
    aggregate_s = summary.get("aggregate_s_median")
    if aggregate_s is not None:
        robust = summary.get("robust")
        clipped = f", {robust['clipped']} updates clipped" if robust and robust["method"] == "clip" else ""
        rule = f" ({robust['method']}{clipped})" if robust else ""
        lines.append(f"| server aggregation per round (ms, median){rule} | {1e3 * aggregate_s:.1f} |")
    bounded = summary.get("peer_bound")
    if bounded:
        lines.append(
            f"| updates shortened by max-update-ratio {bounded['ratio']:g} (all rounds) | {bounded['clipped']} |"
        )
    private = summary.get("dp")
    if private:
        clipped = f", {private['clipped']} updates clipped" if private.get("mode", "central") == "central" else ""
        who = {"local": "the client with the most uploads", "distributed": "the client in the most sums"}.get(
            private.get("mode", "central"), "the run"
        )
        lines.append(
            f"| {private.get('mode', 'central')} DP: epsilon at delta {private.get('delta', 0):g} of {who} after "
            f"{private['rounds']} rounds (noise multiplier {private['noise_multiplier']:.4f}, clip "
            f"{private['clip_bound']:g}{clipped}) | {private['epsilon']:.3f} |"
        )
        if "metrics" in private:
            lines.append(f"| local DP: the clients' loss, counts and evaluations | {private['metrics']} |")
    used, sent = summary["replies_used"], summary["replies_sent"]
    lines.append(f"| training replies used / sent | {sum(used)} / {sum(sent)} (per round min {min(used, default=0)}) |")
    lines.append(
        f"| not used: failed / late / rejected | {sum(summary.get('replies_failed', []))} / "
        f"{sum(summary.get('replies_late', []))} / {sum(summary.get('replies_rejected', []))} |"
    )
    lines.append("")
    return "\n".join(lines)
