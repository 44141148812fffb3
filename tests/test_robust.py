"""Robust aggregation (norm clipping, trimmed mean, median), the simulated model-replacement attacker, and replies
that must name the round and phase they answer."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from flwr.app import MessageType

from client_app.algorithms import answer
from common.config import ConfigError, parse_run_config
from common.data.noise import shift_labels
from common.methods.robust import (
    RobustRule,
    boosted_upload,
    clip_updates,
    coordinate_median,
    robust_average,
    trimmed_count,
    trimmed_mean,
    update_norms,
)
from server_app.results import render_markdown, summarize

from .fakes import FakeReply
from .inprocess import InProcessFederation

ZERO = [np.zeros(2, np.float32)]


def models(*rows: list[float]) -> list[list[np.ndarray]]:
    return [[np.array(row, dtype=np.float32)] for row in rows]


# ----- the rules on hand-made tensors ------------------------------------------------------------------------
def test_clipping_shortens_only_the_long_updates() -> None:
    clipped, count = clip_updates(models([3.0, 4.0], [0.6, 0.8]), ZERO, bound=2.5)
    assert count == 1
    np.testing.assert_allclose(clipped[0][0], [1.5, 2.0])
    np.testing.assert_allclose(clipped[1][0], [0.6, 0.8])
    # around a non-zero reference: the update, not the model, is clipped
    clipped, _ = clip_updates(models([13.0, 14.0]), [np.array([10.0, 10.0], np.float32)], bound=2.5)
    np.testing.assert_allclose(clipped[0][0], [11.5, 12.0])
    with pytest.raises(ValueError, match="clip bound"):
        clip_updates(models([1.0, 1.0]), ZERO, bound=float("nan"))


def test_clip_with_bound_zero_uses_the_median_update_norm() -> None:
    ups = models([1.0, 0.0], [0.0, 2.0], [100.0, 0.0])  # norms 1, 2, 100 -> bound 2
    averaged, report = robust_average(ups, [1, 1, 2], ZERO, RobustRule("clip"))
    assert report == {"method": "clip", "norm_bound": 2.0, "clipped": 1, "max_norm": 100.0, "weights_capped": 1}
    np.testing.assert_allclose(averaged[0], [(1.0 + 2.0) / 3, 2.0 / 3])  # the weight 2 capped at the median, 1
    _, fixed = robust_average(ups, [1, 1, 2], ZERO, RobustRule("clip", clip_norm=50.0))
    assert fixed["clipped"] == 1 and fixed["norm_bound"] == 50.0


def test_trimmed_mean_and_median_are_coordinate_wise() -> None:
    ups = models([1.0, -100.0], [2.0, 0.0], [3.0, 1.0], [4.0, 2.0], [100.0, 3.0])
    np.testing.assert_allclose(trimmed_mean(ups, 0.2)[0], [3.0, 1.0])  # drops one value at each end per coordinate
    np.testing.assert_allclose(trimmed_mean(ups, 0.0)[0], [3.0, 1.0])  # trim 0 still drops one at each end
    np.testing.assert_allclose(coordinate_median(ups)[0], [3.0, 1.0])
    averaged, report = robust_average(ups, [1, 1, 1, 1, 10**6], ZERO, RobustRule("trimmed-mean", trim=0.2))
    np.testing.assert_allclose(averaged[0], [3.0, 1.0])  # the sample counts are ignored
    assert report == {"method": "trimmed-mean", "trimmed_each_end": 1}


def test_trim_drops_at_least_one_at_each_end_keeps_one_and_refuses_half() -> None:
    assert [trimmed_count(n, 0.2) for n in (3, 4, 5, 10, 20)] == [1, 1, 1, 2, 4]
    assert trimmed_count(3, 0.49) == 1 and trimmed_count(4, 0.0) == 1
    for n in (1, 2):
        with pytest.raises(ValueError, match="cannot trim"):
            trimmed_count(n, 0.2)
    with pytest.raises(ValueError, match="trim"):
        trimmed_count(10, 0.5)


# ----- attacks replayed: the rules hold with few clients and inflated counts ---------------------------------
@pytest.mark.parametrize("method", ["trimmed-mean", "median"])
def test_with_four_clients_one_huge_update_does_not_become_the_global_update(method: str) -> None:
    ups = models([0.1, 0.2], [0.2, 0.1], [0.15, 0.15], [1.75e6, -1.75e6])  # the old trimmed mean trimmed nothing
    averaged, _ = robust_average(ups, [1, 1, 1, 1], ZERO, RobustRule(method, trim=0.2))
    assert np.abs(averaged[0]).max() <= 0.2 + 1e-6


def test_under_clip_a_client_declaring_the_largest_count_does_not_set_the_direction() -> None:
    rng = np.random.default_rng(0)
    honest = [[np.float32(1.0) + 0.1 * rng.standard_normal(50).astype(np.float32)] for _ in range(19)]
    attacker = [np.full(50, -30.0, np.float32)]
    weights = [2250.0] * 19 + [100_000.0]  # the most max-client-samples allows
    averaged, report = robust_average([*honest, attacker], weights, [np.zeros(50, np.float32)], RobustRule("clip"))
    cosine = float(averaged[0] @ attacker[0] / np.linalg.norm(averaged[0]) / np.linalg.norm(attacker[0]))
    assert cosine < -0.9, f"the global update follows the honest clients, not the attacker (cosine {cosine:.2f})"
    assert report["clipped"] >= 1 and report["weights_capped"] == 1


@pytest.mark.parametrize("method", ["clip", "trimmed-mean", "median"])
def test_a_robust_rule_with_two_updates_keeps_the_model(method: str) -> None:
    reference = [np.array([1.0, 2.0], np.float32)]
    averaged, report = robust_average(models([0.0, 0.0], [1e6, 1e6]), [1, 1], reference, RobustRule(method))
    np.testing.assert_array_equal(averaged[0], reference[0])
    assert report == {"method": method, "skipped": "2 update(s), fewer than the 3 a robust rule needs"}


def test_a_client_counts_at_most_max_weight_ratio_times_the_median_declared_count() -> None:
    from .fakes import hand_made_runner, train_content

    specs = [("body.w", (2,))]
    sizes = {0: 10, 1: 10, 2: 10, 3: 10, 4: 100_000}  # client 4 declares the most max-client-samples allows
    runner = hand_made_runner(parse_run_config({}), specs, [np.zeros(2, np.float32)], sizes)
    runner.clients.max_weight_ratio = 4.0  # run-config max-weight-ratio, as the deployment recipes set it
    assert runner.clients.weight_cap(4) == 40.0  # 4 x the median count the others declared, 10
    assert runner.clients.weighted_total() == 80.0  # FLIU's n: the inflated count capped too
    replies = [FakeReply(100 + pid, train_content(["body.w"], [np.zeros(2, np.float32)], 10)) for pid in range(4)]
    bad = train_content(["body.w"], [np.full(2, 100.0, np.float32)], 100_000)
    runner.aggregate_train(1, [*replies, FakeReply(104, bad)])
    np.testing.assert_allclose(runner.strategy.global_arrays[0], [50.0, 50.0])  # 40 / (4 x 10 + 40) of 100
    uncapped = hand_made_runner(parse_run_config({}), specs, [np.zeros(2, np.float32)], sizes)  # studies: no cap
    uncapped.aggregate_train(1, [*replies, FakeReply(104, bad)])
    assert uncapped.strategy.global_arrays[0][0] > 99.9  # what a declared count bought before the cap


def test_a_clients_own_declared_count_is_not_in_its_weight_caps_reference() -> None:
    """With two clients the median of all declared counts is the mean of both: an attacker declaring 100,000 would
    raise its own cap with it. Its reference is the other client's count alone."""
    from server_app.clients import ClientInfo, ClientRegistry

    clients = ClientRegistry(max_weight_ratio=4.0)
    clients.add(ClientInfo(0, 10, 10, 5))
    clients.add(ClientInfo(1, 11, 100_000, 5))
    assert clients.weight_cap(1) == 40.0 and clients.weight_cap(0) == 400_000.0
    assert clients.weighted_total() == 50.0
    lone = ClientRegistry(max_weight_ratio=4.0)
    lone.add(ClientInfo(0, 10, 7, 5))
    assert lone.weight_cap(0) == math.inf  # one client: its weight normalizes to 1 whatever it is


def test_plain_averaging_reports_nothing_and_unknown_rules_fail() -> None:
    averaged, report = robust_average(models([0.0, 0.0], [4.0, 8.0]), [3, 1], ZERO, RobustRule())
    np.testing.assert_allclose(averaged[0], [1.0, 2.0])
    assert report == {}
    with pytest.raises(ValueError, match="unknown robust aggregation"):
        robust_average(models([0.0, 0.0]), [1], ZERO, RobustRule("krum"))


def test_model_replacement_upload_and_label_shift() -> None:
    received = {"w": np.array([1.0, 1.0], np.float32), "b": np.zeros(1, np.float32)}
    upload = {"w": np.array([1.5, 0.0], np.float32), "b": np.ones(1, np.float32), "extra": np.ones(2, np.float32)}
    out = boosted_upload(upload, received, boost=10.0)
    np.testing.assert_allclose(out["w"], [6.0, -9.0])
    np.testing.assert_allclose(out["b"], [10.0])
    np.testing.assert_allclose(out["extra"], [1.0, 1.0])  # not received: sent as trained
    np.testing.assert_array_equal(shift_labels(np.array([0, 3, 9]), 10), [1, 4, 0])


# ----- configuration -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw, message",
    [
        (
            {"algorithm": "dmpfl", "robust-aggregation": "median"},
            "'robust-aggregation' applies to the weight-averaging",
        ),
        ({"algorithm": "fedfomo", "attack-clients": 0.1}, "'attack-clients' applies to the algorithms whose server"),
        ({"robust-aggregation": "krum"}, "robust-aggregation"),
        ({"robust-trim": 0.5}, "robust-trim"),
        ({"robust-clip-norm": -1}, "robust-clip-norm"),
        ({"attack-boost": 0.5}, "attack-boost"),
    ],
)
def test_bad_robust_settings_are_one_line_errors(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_run_config(raw)


def test_robust_keys_apply_to_every_weight_averaging_algorithm() -> None:
    for algorithm in ("fedavg", "fedprox", "fliu", "fedper", "ditto", "apfl"):
        cfg = parse_run_config({"algorithm": algorithm, "robust-aggregation": "clip", "attack-clients": 0.2})
        assert cfg.robust_rule == RobustRule("clip", 0.0, 0.2)


# ----- through the round runner ------------------------------------------------------------------------------
def _attacked(rule: str) -> tuple[InProcessFederation, float]:
    raw = {
        "algorithm": "fedavg",
        "dataset": "digits",
        "num-rounds": 2,
        "fraction-train": 1.0,
        "local-epochs": 1,
        "attack-clients": 0.2,
        "attack-boost": 10.0,
        "robust-aggregation": rule,
    }
    fed = InProcessFederation(raw, 10)
    before = [a.copy() for a in fed.strategy.global_arrays]
    fed.train_round(1)
    return fed, float(update_norms([fed.strategy.global_arrays], before)[0])


def test_two_attackers_move_the_global_model_unless_their_updates_are_clipped() -> None:
    plain, moved = _attacked("none")
    clipped, bounded = _attacked("clip")
    attackers = [pid for pid, data in clipped.data.items() if data.attacker]
    assert len(attackers) == 2
    report = clipped.round_log.train["robust"]
    assert report["method"] == "clip" and report["clipped"] >= 2 and report["max_norm"] > 5 * report["norm_bound"]
    assert bounded <= report["norm_bound"] * (1 + 1e-5), "a convex mix of clipped updates stays inside the bound"
    assert moved > 3 * bounded, "without a defence the boosted updates dominate"
    assert "robust" not in plain.round_log.train and plain.round_log.aggregate_s >= 0
    trimmed, trimmed_move = _attacked("trimmed-mean")
    assert trimmed.round_log.train["robust"] == {"method": "trimmed-mean", "trimmed_each_end": 2}
    assert trimmed_move < moved / 2


def test_the_summary_reports_the_aggregation_cost() -> None:
    records = [
        {
            "round": r,
            "wall_s": 1.0,
            "aggregate_s": t,
            "bytes": dict.fromkeys(("train_down", "train_up", "eval_down", "eval_up"), 0),
            "train": {"used": 2, "sent": 2, "robust": {"method": "clip", "clipped": c}},
        }
        for r, t, c in ((1, 0.004, 2), (2, 0.002, 1), (3, 0.010, 0))
    ]
    summary = summarize(records, {"algorithm": "fedavg", "num_clients": 2})
    assert summary["aggregate_s_median"] == 0.004 and summary["robust"] == {"method": "clip", "clipped": 3}
    assert "| server aggregation per round (ms, median) (clip, 3 updates clipped) | 4.0 |" in render_markdown(summary)


# ----- replies name their round and phase --------------------------------------------------------------------
def test_a_reply_must_name_the_round_and_phase_it_answers(caplog) -> None:
    raw = {
        "algorithm": "dmpfl",
        "dataset": "digits",
        "num-rounds": 3,
        "iterations": 1,
        "fraction-train": 1.0,
        "local-epochs": 1,
    }
    fed = InProcessFederation(raw, 2)
    fed.train_round(1)
    contents = fed.runner.message_contents(2, [0, 1], MessageType.TRAIN)
    replies = {pid: answer(fed.client(pid), MessageType.TRAIN, 2, c) for pid, c in zip((0, 1), contents)}
    assert {k: replies[0].metric_records["metrics"][k] for k in ("server-round", "phase")} == {
        "server-round": 2,
        "phase": 2,
    }
    replies[0].metric_records["metrics"]["server-round"] = 1
    replies[1].metric_records["metrics"]["phase"] = 1
    with caplog.at_level(logging.WARNING, logger="flwr"):
        fed.runner.aggregate_train(2, [FakeReply(1000 + pid, r) for pid, r in replies.items()])
    assert fed.round_log.train["used"] == 0
    assert "it answers server-round 1, but the message sent was for server-round 2" in caplog.text
    assert "it answers phase 1, but the message sent was for phase 2" in caplog.text
    del replies[0].metric_records["metrics"]["server-round"]
    fed.runner.round_log.train.clear()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        fed.runner.aggregate_train(2, [FakeReply(1000, replies[0])])
    assert "it answers server-round None" in caplog.text and fed.round_log.train["used"] == 0


def test_a_robust_rule_refuses_a_run_with_fewer_than_three_training_clients_a_round(tmp_path, caplog) -> None:
    from experiments.engine.serve import serve

    raw = {"algorithm": "fedavg", "dataset": "digits", "num-rounds": 1, "robust-aggregation": "clip"}
    with caplog.at_level(logging.ERROR, logger="flwr"):
        assert not serve({**raw, "results-dir": str(tmp_path)}, clients=2, workers=1)
    assert "robust-aggregation 'clip' needs at least 3 training clients a round to outvote a bad update; this run " in (
        caplog.text
    )
