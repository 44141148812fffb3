"""The results folder of a run: config.json, metrics.jsonl (one line per round), summary.md and PNG plots."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from common.algorithms import FINETUNED, eval_rows
from common.config import RunConfig, parse_run_config
from common.data.domains import DOMAINS
from common.evaluate import shift_key
from common.persist import atomic_file, atomic_write_text

from .replies import RoundLog, domain_key
from .shift_report import corruption_lines, domain_shift_lines, plot_corruptions


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """A run folder's config.json, with the default of every key added since that run was made."""
    defaults = parse_run_config({}).to_dict()
    return {**defaults, **json.loads((Path(run_dir) / "config.json").read_text())}


def round_record(server_round: int, wall: float, elapsed: float, log: RoundLog,
                 extra: dict[str, Any]) -> dict[str, Any]:
    """A round's line of metrics.jsonl, from its counters and the algorithm's own fields."""
    return {"round": server_round, "wall_s": wall, "elapsed_s": elapsed, "train": log.train, "bytes": log.bytes,
            "bytes_per_client": {str(k): v for k, v in sorted(log.per_client_bytes.items())}, "eval": log.eval,
            **({"aggregate_s": log.aggregate_s} if log.aggregate_s is not None else {}),
            **({"unseen": log.unseen} if log.unseen else {}), **extra}


def settings_text(cfg: RunConfig, num_clients: int) -> str:
    """One log line with the run's main settings."""
    text = (f"{cfg.algorithm}: {num_clients} clients, {100 * cfg.fraction_train:.0f}% per round, {cfg.num_rounds} "
            f"rounds, {cfg.local_epochs} local epochs, lr {cfg.lr:g}")
    return text + (f", robust aggregation {cfg.robust_aggregation}" if cfg.robust_aggregation != "none" else "")


def progress_text(record: dict[str, Any], num_rounds: int, degrees: tuple[float, ...], elapsed: float) -> str:
    """The progress log line of a finished round: replies, loss, traffic, accuracy, time and ETA."""
    rnd = record["round"]
    eta = elapsed / rnd * (num_rounds - rnd)
    train = record["train"]
    text = (f"[round {rnd}/{num_rounds}] train {train['used']}/{train['sent']} used, loss {train['loss']:.4f}"
            f" | down {record['bytes']['train_down'] / 1e6:.2f} MB up {record['bytes']['train_up'] / 1e6:.2f} MB")
    if record["eval"]:
        mean, std = record["eval"]["mean"], record["eval"]["std"]
        k0, k1 = shift_key(min(degrees)), shift_key(max(degrees))
        text += (f" | acc {100 * mean[k0]:.2f}+/-{100 * std[k0]:.2f}%"
                 f" (shift {100 * max(degrees):g}%: {100 * mean[k1]:.2f}%)")
    seconds = int(round(eta))
    return text + f" | {record['wall_s']:.1f}s, ETA {seconds // 60}m{seconds % 60:02d}s"


def make_run_dir(base: Path, algorithm: str, dataset: str, run_name: str) -> Path:
    """A new folder under `base` named after the run (or algorithm-dataset-timestamp); never reuses one."""
    stem = run_name or f"{algorithm}-{dataset}-{time.strftime('%Y%m%d-%H%M%S')}"
    path = base / stem
    suffix = 1
    while path.exists():
        suffix += 1
        path = base / f"{stem}-{suffix}"
    path.mkdir(parents=True)
    return path


def _mb(num_bytes: float) -> float:
    return num_bytes / 1e6


def _fmt(value: float, pct: bool = True) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.2f}" if pct else f"{value:.3f}"


class ResultsWriter:
    """Writes one run's results as the run goes, so a crash loses at most the round in progress."""

    def __init__(self, run_dir: Path, config: dict[str, Any], resume: bool = False) -> None:
        self.run_dir = run_dir
        self.records: list[dict[str, Any]] = []
        atomic_write_text(run_dir / "config.json", json.dumps(config, indent=2, sort_keys=True))
        self._metrics = run_dir / "metrics.jsonl"
        self._digests = run_dir / "messages.jsonl"
        if not resume:
            self._metrics.write_text("")
            self._digests.unlink(missing_ok=True)

    def restart_from(self, records: list[dict[str, Any]]) -> None:
        """Continue after the given rounds (a checkpoint's): metrics.jsonl is rewritten to hold just them, and
        messages.jsonl (when the run keeps digests) just theirs."""
        self.records = list(records)
        atomic_write_text(self._metrics, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        if self._digests.is_file():
            last = records[-1]["round"] if records else 0
            kept = [line for line in self._digests.read_text().splitlines()
                    if line.strip() and json.loads(line)["round"] <= last]
            atomic_write_text(self._digests, "".join(line + "\n" for line in kept))

    def add_round(self, record: dict[str, Any], digests: list[dict[str, Any]] | None = None) -> None:
        """Append one round's record to metrics.jsonl (flushed), and its messages' digests to messages.jsonl."""
        self.records.append(record)
        with self._metrics.open("a") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
        if digests is not None:
            with self._digests.open("a") as fh:
                fh.writelines(json.dumps({"round": record["round"], **d}, sort_keys=True) + "\n" for d in digests)

    def finish(self, info: dict[str, Any], artifacts: dict[str, np.ndarray] | None = None) -> Path:
        """Write summary.md, the plots and the algorithm's artifacts.npz; return the summary's absolute path."""
        if artifacts:
            with atomic_file(self.run_dir / "artifacts.npz") as fh:
                np.savez(fh, allow_pickle=False, **artifacts)
        summary = summarize(self.records, info)
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True))
        path = self.run_dir / "summary.md"
        atomic_write_text(path, render_markdown(summary))
        plot_run(self.records, summary, self.run_dir)
        return path.resolve()


def summarize(records: list[dict[str, Any]], info: dict[str, Any]) -> dict[str, Any]:
    """Final and best accuracies, costs and reply counts of a run, from its round records."""
    evaluated = [r for r in records if r.get("eval")]
    final = evaluated[-1]["eval"] if evaluated else None
    degrees = info.get("shift_degrees", [])
    best_mean = max((r["eval"]["mean"][shift_key(0.0)] for r in evaluated
                     if shift_key(0.0) in r["eval"]["mean"]), default=float("nan"))
    num_clients = max(int(info.get("num_clients", 1)), 1)
    totals = {k: sum(r["bytes"][k] for r in records) for k in ("train_down", "train_up", "eval_down", "eval_up")}
    return {
        **info,
        "rounds_completed": len(records),
        "final_round": evaluated[-1]["round"] if evaluated else None,
        "final": final and {"mean": final["mean"], "std": final["std"], "num_clients": final["num_clients"]},
        "best_mean_accuracy": best_mean,
        "bytes_total": totals,
        "mb_per_client": {k: _mb(v) / num_clients for k, v in totals.items()},
        "train_flops_total": sum(r["train"].get("flops", 0) for r in records),
        "train_flops_per_client": sum(r["train"].get("flops", 0) for r in records) / num_clients,
        "replies_used": [r["train"]["used"] for r in records],
        "replies_sent": [r["train"]["sent"] for r in records],
        "replies_failed": [r["train"].get("failed", 0) for r in records],
        "replies_late": [r["train"].get("late", 0) for r in records],
        "replies_rejected": [r["train"].get("rejected", 0) for r in records],
        "wall_seconds": sum(r["wall_s"] for r in records),
        **_aggregation_cost(records),
        **_costs_by_ratio(records),
        "shift_degrees": degrees,
        **({"unseen": evaluated[-1]["unseen"]} if evaluated and evaluated[-1].get("unseen") else {}),
        **_last_stages(records),
    }


def _costs_by_ratio(records: list[dict[str, Any]]) -> dict[str, Any]:
    """DapperFL: per pruning ratio, the clients, values uploaded, and per client-round training FLOPs and MB."""
    table: dict[str, dict[str, Any]] = {}
    for record in records:
        for ratio, entry in record.get("by_ratio", {}).items():
            row = table.setdefault(ratio, {"clients": set(), "values": entry["values"], "flops": [], "up": [],
                                           "down": []})
            row["clients"].update(entry["clients"])
            row["flops"].append(entry["train_flops"])
            for pid in entry["clients"]:
                sent = record["bytes_per_client"].get(str(pid), {"up": 0, "down": 0})
                row["up"].append(_mb(sent["up"]))
                row["down"].append(_mb(sent["down"]))
    if not table:
        return {}
    return {"by_ratio": {ratio: {"clients": sorted(row["clients"]), "values": row["values"],
                                 "train_flops": float(np.mean(row["flops"])), "mb_up": float(np.mean(row["up"])),
                                 "mb_down": float(np.mean(row["down"]))} for ratio, row in table.items()}}


def _aggregation_cost(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Server time spent aggregating (median per round) and, under a robust rule, how many updates it clipped."""
    times = sorted(r["aggregate_s"] for r in records if "aggregate_s" in r)
    robust = [r["train"]["robust"] for r in records if r["train"].get("robust")]
    out: dict[str, Any] = {"aggregate_s_median": times[len(times) // 2] if times else None}
    if robust:
        out["robust"] = {"method": robust[-1]["method"], "clipped": sum(r.get("clipped", 0) for r in robust)}
    return out


def _last_stages(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The stage accuracies (G, L1, L2) of the last round that reported them."""
    with_stages = [r for r in records if r["train"].get("stages")]
    if not with_stages:
        return {}
    return {"stages": with_stages[-1]["train"]["stages"], "stages_round": with_stages[-1]["round"]}


def _stage_lines(summary: dict[str, Any]) -> list[str]:
    stages = summary.get("stages")
    if not stages:
        return []
    eps = sorted({e for row in stages.values() for e in row["rho"]}, key=float)
    lines = [f"Stages (FLIU) of the clients trained in round {summary['stages_round']}: Acc(L) on the client's own "
             "test split, Acc(G) on the pooled test set, Acc = Acc(L) + Acc(G) (%, mean +/- std); "
             "rho_eps = clients with Acc(L) > eps.", "",
             "| stage | Acc(L) | Acc(G) | Acc | " + " | ".join(f"rho_{e}" for e in eps) + " |",
             "|---|---|---|---|" + "---|" * len(eps)]
    for stage, row in stages.items():
        cells = [f"{_fmt(row[k][0])} +/- {_fmt(row[k][1])}" for k in ("acc_local", "acc_global", "acc")]
        lines.append(f"| {stage} | " + " | ".join(cells) + " | "
                     + " | ".join(f"{row['rho'].get(e, 0)}/{row['clients']}" for e in eps) + " |")
    return lines + [""]


def _degree_cells(stats: dict[str, Any], prefix: str, degrees: list[float]) -> list[str]:
    """'mean +/- std' (%) of a row of evaluation statistics at each shift degree."""
    return [f"{_fmt(stats['mean'][prefix + shift_key(d)])} +/- {_fmt(stats['std'][prefix + shift_key(d)])}"
            for d in degrees]


def _unseen_lines(summary: dict[str, Any]) -> list[str]:
    """Held-out clients: the newcomer model's accuracy as received and after fine-tuning, by shift degree."""
    unseen, degrees = summary.get("unseen"), summary["shift_degrees"]
    if not unseen:
        return []
    lines = [f"Held-out clients ({unseen['num_clients']}, never trained; {unseen['failed']} failed): the model a new "
             "client receives, as received and after local fine-tuning (%, mean +/- std):", "",
             "| unseen clients | " + " | ".join(f"{100 * d:g}%" for d in degrees) + " |",
             "|---|" + "---|" * len(degrees)]
    for prefix, label in (("", "as received"), (FINETUNED.prefix, FINETUNED.label)):
        if prefix + shift_key(degrees[0]) in unseen["mean"]:
            lines.append(f"| {label} | " + " | ".join(_degree_cells(unseen, prefix, degrees)) + " |")
    return lines + [""]


def _domain_lines(summary: dict[str, Any]) -> list[str]:
    """Multi-domain data: the global model's accuracy on each domain's held-out test data, and their mean."""
    final = summary.get("final") or {}
    rows = [(name, final["mean"][domain_key(name)]) for name in DOMAINS if domain_key(name) in final.get("mean", {})]
    if not rows:
        return []
    mean = sum(value for _, value in rows) / len(rows)
    return ["Global model on each domain's held-out test data (%), and their mean (global accuracy):", "",
            "| " + " | ".join(name for name, _ in rows) + " | global accuracy |", "|---" * (len(rows) + 1) + "|",
            "| " + " | ".join(_fmt(value) for _, value in rows) + f" | {_fmt(mean)} |", ""]


def _ratio_lines(summary: dict[str, Any]) -> list[str]:
    """DapperFL: costs per client by pruning ratio."""
    table = summary.get("by_ratio")
    if not table:
        return []
    lines = ["Per client and round, by pruning ratio (measured):", "",
             "| ratio | clients | values uploaded | training FLOPs | MB up | MB down |", "|---|---|---|---|---|---|"]
    for ratio, row in sorted(table.items(), key=lambda item: float(item[0])):
        lines.append(f"| {ratio} | {len(row['clients'])} | {row['values']:,} | {row['train_flops']:.3e} | "
                     f"{row['mb_up']:.3f} | {row['mb_down']:.3f} |")
    return lines + [""]


def render_markdown(summary: dict[str, Any]) -> str:
    """summary.md: one table of accuracy at each shift degree, then costs and replies."""
    lines = [f"# {summary.get('algorithm', '?')} on {summary.get('dataset', '?')}", ""]
    lines.append(f"{summary.get('num_clients')} clients, partition {summary.get('partition')}, "
                 f"{summary['rounds_completed']} rounds, seed {summary.get('seed')}.")
    if summary.get("resumed_after_rounds"):
        lines.append(f"Stopped and resumed from its checkpoint after round(s) "
                     f"{', '.join(map(str, summary['resumed_after_rounds']))}.")
    lines.append("")
    final = summary.get("final")
    if final:
        degrees = summary["shift_degrees"]
        lines.append(f"Accuracy (%) of the {final['num_clients']} evaluated clients after round "
                     f"{summary['final_round']}: mean +/- std across clients, by test-time shift degree.")
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
    if summary.get("aggregate_s_median") is not None:
        robust = summary.get("robust")
        clipped = f", {robust['clipped']} updates clipped" if robust and robust["method"] == "clip" else ""
        rule = f" ({robust['method']}{clipped})" if robust else ""
        lines.append(f"| server aggregation per round (ms, median){rule} | {1e3 * summary['aggregate_s_median']:.1f} |")
    used, sent = summary["replies_used"], summary["replies_sent"]
    lines.append(f"| training replies used / sent | {sum(used)} / {sum(sent)} (per round min {min(used, default=0)}) |")
    lines.append(f"| not used: failed / late / rejected | {sum(summary.get('replies_failed', []))} / "
                 f"{sum(summary.get('replies_late', []))} / {sum(summary.get('replies_rejected', []))} |")
    lines.append("")
    return "\n".join(lines)


def plot_run(records: list[dict[str, Any]], summary: dict[str, Any], run_dir: Path) -> None:
    """accuracy_vs_round.png, accuracy_vs_shift.png and, with corruptions, accuracy_vs_corruption.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evaluated = [r for r in records if r.get("eval")]
    if not evaluated:
        return
    degrees = summary["shift_degrees"]
    fig, ax = plt.subplots(figsize=(6, 4))
    rounds = [r["round"] for r in evaluated]
    for d in degrees:
        ax.plot(rounds, [100 * r["eval"]["mean"][shift_key(d)] for r in evaluated], marker=".",
                label=f"shift {100 * d:g}%")
    ax.set_xlabel("round")
    ax.set_ylabel("mean client accuracy (%)")
    ax.set_title(f"{summary.get('algorithm')} on {summary.get('dataset')}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(run_dir / "accuracy_vs_round.png", dpi=120)
    plt.close(fig)

    final = summary["final"]
    fig, ax = plt.subplots(figsize=(6, 4))
    means = [100 * final["mean"][shift_key(d)] for d in degrees]
    stds = [100 * final["std"][shift_key(d)] for d in degrees]
    ax.errorbar([100 * d for d in degrees], means, yerr=stds, marker="o", capsize=3)
    ax.set_xlabel("test-time shift degree (%)")
    ax.set_ylabel("accuracy (%), mean +/- std over clients")
    ax.set_title(f"{summary.get('algorithm')}: accuracy under shift (round {summary['final_round']})")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(run_dir / "accuracy_vs_shift.png", dpi=120)
    plt.close(fig)
    plot_corruptions(summary, run_dir)
