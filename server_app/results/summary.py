"""summary.json: final and best accuracies, costs and reply counts of a run, from its round records."""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from common.stopping import accuracy_curve, best_round
from common.storage.run_folder import FinalEvaluation, RoundRecord, Summary


def _mb(num_bytes: float) -> float:
    return num_bytes / 1e6


def summarize(records: list[RoundRecord], info: dict[str, Any]) -> Summary:
    """Final and best accuracies, costs and reply counts of a run, from its round records."""
    evaluated = [r for r in records if r.get("eval")]
    last = evaluated[-1]["eval"] if evaluated else None
    final = last and FinalEvaluation(mean=last["mean"], std=last["std"], num_clients=last["num_clients"])
    degrees = info.get("shift_degrees", [])
    curve = accuracy_curve(records)
    best_mean = max((acc for _, acc in curve), default=float("nan"))
    num_clients = max(int(info.get("num_clients", 1)), 1)
    totals = {k: sum(r["bytes"][k] for r in records) for k in ("train_down", "train_up", "eval_down", "eval_up")}
    flops = sum(r["train"].get("flops", 0) for r in records)
    # a round recorded without flops_dense_grad (an older run) counts its flops
    flops_dense_grad = sum(r["train"].get("flops_dense_grad", r["train"].get("flops", 0)) for r in records)
    summary = {
        **info,
        "rounds_completed": len(records),
        "final_round": evaluated[-1]["round"] if evaluated else None,
        "final": final,
        "best_mean_accuracy": best_mean,
        "best_round": best_round(curve),
        "bytes_total": totals,
        "mb_per_client": {k: _mb(v) / num_clients for k, v in totals.items()},
        "train_flops_total": flops,
        "train_flops_per_client": flops / num_clients,
        "train_flops_dense_grad_total": flops_dense_grad,
        "train_flops_dense_grad_per_client": flops_dense_grad / num_clients,
        "replies_used": [r["train"]["used"] for r in records],
        "replies_sent": [r["train"]["sent"] for r in records],
        "replies_failed": [r["train"].get("failed", 0) for r in records],
        "replies_late": [r["train"].get("late", 0) + r["train"].get("timed_out", 0) for r in records],
        "replies_rejected": [r["train"].get("rejected", 0) for r in records],
        "wall_seconds": sum(r["wall_s"] for r in records),
        **_aggregation_cost(records),
        **_costs_by_ratio(records),
        "shift_degrees": degrees,
        **({"unseen": evaluated[-1]["unseen"]} if evaluated and evaluated[-1].get("unseen") else {}),
        **_last_stages(records),
    }
    return cast(Summary, summary)


def _costs_by_ratio(records: list[RoundRecord]) -> dict[str, Any]:
    """DapperFL: per pruning ratio, the clients, values uploaded, and per client-round training FLOPs and MB."""
    table: dict[str, dict[str, Any]] = {}
    for record in records:
        for ratio, entry in record.get("by_ratio", {}).items():
            row = table.setdefault(
                ratio, {"clients": set(), "values": entry["values"], "flops": [], "up": [], "down": []}
            )
            row["clients"].update(entry["clients"])
            row["flops"].append(entry["train_flops"])
            for pid in entry["clients"]:
                sent = record["bytes_per_client"].get(str(pid), {"up": 0, "down": 0})
                row["up"].append(_mb(sent["up"]))
                row["down"].append(_mb(sent["down"]))
    if not table:
        return {}
    return {
        "by_ratio": {
            ratio: {
                "clients": sorted(row["clients"]),
                "values": row["values"],
                "train_flops": float(np.mean(row["flops"])),
                "mb_up": float(np.mean(row["up"])),
                "mb_down": float(np.mean(row["down"])),
            }
            for ratio, row in table.items()
        }
    }


def _aggregation_cost(records: list[RoundRecord]) -> dict[str, Any]:
    """Server time spent aggregating (median per round) and, under a robust rule, how many updates it clipped."""
    times = sorted(r["aggregate_s"] for r in records if "aggregate_s" in r)
    robust = [r["train"]["robust"] for r in records if r["train"].get("robust")]
    out: dict[str, Any] = {"aggregate_s_median": times[len(times) // 2] if times else None}
    if robust:
        out["robust"] = {"method": robust[-1]["method"], "clipped": sum(r.get("clipped", 0) for r in robust)}
    bounded = [r["train"]["peer_bound"] for r in records if r["train"].get("peer_bound")]
    if bounded:  # run-config max-update-ratio
        out["peer_bound"] = {"ratio": bounded[-1]["ratio"], "clipped": sum(r["clipped"] for r in bounded)}
    private = [r["train"]["dp"] for r in records if r["train"].get("dp")]
    if private:  # the last round's epsilon is what the whole run spent
        last = private[-1]
        out["dp"] = {
            "mode": last.get("mode", "central"),
            "epsilon": last["epsilon"],
            "delta": last["delta"],
            "noise_multiplier": last["noise_multiplier"],
            "clip_bound": last["clip_bound"],
            "clipped": int(sum(r.get("clipped", 0) for r in private)),
            "rounds": len(private),
            **({"metrics": last["metrics"]} if "metrics" in last else {}),
        }
    return out


def _last_stages(records: list[RoundRecord]) -> dict[str, Any]:
    """The stage accuracies (G, L1, L2) of the last round that reported them."""
    with_stages = [r for r in records if r["train"].get("stages")]
    if not with_stages:
        return {}
    return {"stages": with_stages[-1]["train"]["stages"], "stages_round": with_stages[-1]["round"]}
