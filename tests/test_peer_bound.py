"""Run-config max-update-ratio: in every weighted average an update is shortened to at most that many times the
median norm of the round's *other* updates, so one boosted update (model replacement) cannot set the model, even
with the weight cap and no robust rule (DM-PFL's deployment recipe)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import RecordDict

from common.config import ConfigError, parse_run_config
from common.methods.robust import peer_scales, scale_updates, update_norms
from common.wire.records import unflatten
from server_app.replies import TrainReply

from .inprocess import InProcessFederation


def test_each_update_is_bounded_by_the_median_of_the_others() -> None:
    scales = peer_scales([1.0, 2.0, 3.0, 100.0], ratio=2.0)
    assert scales[:3].tolist() == [1.0, 1.0, 1.0]
    assert scales[3] == pytest.approx(2.0 * 2.0 / 100.0), "others' median 2: bound 4"
    # with two updates each one's reference is the other's norm: the attacker cannot raise its own bound
    assert peer_scales([1.0, 10.0], ratio=3.0).tolist() == pytest.approx([1.0, 0.3])
    assert peer_scales([5.0], ratio=1.0).tolist() == [1.0] and peer_scales([0.0, 0.0], 1.0).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="positive"):
        peer_scales([1.0], ratio=0.0)


def test_three_colluders_of_twenty_cannot_raise_the_bound_past_the_honest_spread() -> None:
    honest = np.linspace(1.0, 2.0, 17)
    norms = np.concatenate([honest, [50.0, 50.0, 50.0]])
    scales = peer_scales(norms, ratio=3.0)
    assert np.all(scales[:17] == 1.0)
    bounded = norms[17:] * scales[17:]
    assert np.all(bounded <= 3.0 * np.median(honest) * 1.1), "the colluders move the others' median by one rank"


def test_scaling_moves_a_model_back_along_its_update_exactly() -> None:
    reference = [np.array([1.0, 1.0], np.float32)]
    models = [[np.array([3.0, 1.0], np.float32)], [np.array([1.0, 5.0], np.float32)]]
    out = scale_updates(models, reference, [1.0, 0.25])
    assert out[0][0].tolist() == [3.0, 1.0] and out[1][0].tolist() == [1.0, 2.0]


def test_the_key_is_refused_where_nothing_is_averaged() -> None:
    assert parse_run_config({"algorithm": "dmpfl", "max-update-ratio": 3.0}).max_update_ratio == 3.0
    assert parse_run_config({"algorithm": "heurfedamp", "max-update-ratio": 3.0}).max_update_ratio == 3.0
    with pytest.raises(ConfigError, match="'max-update-ratio' applies to the algorithms that average uploads"):
        parse_run_config({"algorithm": "fedfomo", "max-update-ratio": 3.0})


def _boosted_cloud(algorithm: str, ratio: float) -> tuple[float, dict]:
    """Five clients uploaded once; then four move their model by ~0.01 and the fifth uploads 100 x its model. How
    many times longer than an honest client's model the victims' next u_i is (1: unaffected)."""
    raw = {"algorithm": algorithm, "dataset": "digits", "num-rounds": 3, "fraction-train": 1.0}
    fed = InProcessFederation({**raw, "max-update-ratio": ratio} if ratio else raw, 5)
    fed.warmup()
    fed.train_round(1)
    strategy = fed.strategy
    matrix = strategy.ensure_matrix()
    shapes = [shape for _, shape in strategy.specs]
    rng = np.random.default_rng(0)
    replies = []
    for pid in range(5):
        row = np.array(matrix.W[strategy.rows[pid]], dtype=np.float32)
        model = 100.0 * row if pid == 4 else row + rng.normal(0, 0.01 / np.sqrt(row.size), row.size).astype(np.float32)
        replies.append(TrainReply(pid, 10, 0.0, RecordDict(), arrays=unflatten(model, shapes)))
    honest = float(np.linalg.norm(matrix.W[strategy.rows[0]]))
    strategy.peer_bound = {}
    strategy.aggregate(2, replies)
    cloud = strategy.cloud_for(3, list(range(5)), list(range(4)))
    return max(float(np.linalg.norm(u)) for u in cloud.values()) / honest, strategy.peer_bound


@pytest.mark.parametrize("algorithm", ["heurfedamp", "fedamp"])
def test_one_boosted_upload_no_longer_inflates_the_others_cloud_models(algorithm: str) -> None:
    """HeurFedAMP's cosine attention gives 100 x w the weight of w: unbounded, every victim's u_i grows many times
    over. FedAMP's distance attention already gives it almost none; the bound keeps both near 1."""
    inflated, plain = _boosted_cloud(algorithm, 0.0)
    kept, report = _boosted_cloud(algorithm, 3.0)
    if algorithm == "heurfedamp":
        assert inflated > 5.0 and plain == {}, "without the bound the attacker's scale reaches every u_i"
    assert report["clipped"] == 1 and kept < 1.1


def _replaced(bound: float) -> float:
    """Nine honest updates of norm ~1 and one model-replacement upload (received + 10 x (target - received), target
    10 away) under DM-PFL's recipe for averaging (equal counts within the weight cap, no robust rule): how far the
    averaged model lands from the attacker's target."""
    fed = InProcessFederation({"algorithm": "fedavg", "dataset": "digits", "max-update-ratio": bound}, 2)
    rng = np.random.default_rng(0)
    reference = [np.zeros(100, np.float32)]
    target = [np.full(100, 1.0, np.float32)]  # norm 10
    honest = [[rng.normal(0, 0.1, 100).astype(np.float32)] for _ in range(9)]
    boosted = [10.0 * t for t in target]
    replies = [SimpleNamespace(arrays=m, partition_id=i) for i, m in enumerate([*honest, boosted])]
    averaged = fed.strategy.average(replies, [1.0] * 10, reference)
    return float(update_norms([averaged], target)[0]), fed.strategy.peer_bound


def test_one_boosted_update_no_longer_sets_the_global_model() -> None:
    landed, plain = _replaced(0.0)
    assert landed < 0.5 and plain == {}, "without the bound the average lands on the attacker's target"
    away, report = _replaced(3.0)
    assert report["clipped"] == 1 and report["max_norm"] == pytest.approx(100.0, rel=1e-6)
    assert away > 9.0, "bounded to 3x the others' median norm (~1), it moves the model by ~0.3 of the 10"


@pytest.mark.parametrize("algorithm", ["fliu", "fedper", "dapperfl"])
def test_every_weighted_average_applies_the_bound(algorithm: str) -> None:
    """A tiny ratio shortens every update to almost nothing: the model barely moves, whatever the algorithm."""

    def moved(ratio: float) -> tuple[float, dict]:
        raw = {"algorithm": algorithm, "dataset": "digits", "num-rounds": 2, "fraction-train": 1.0}
        fed = InProcessFederation({**raw, "max-update-ratio": ratio} if ratio else raw, 4)
        before = [a.copy() for a in fed.strategy.global_arrays]
        fed.train_round(1)
        return float(update_norms([fed.strategy.global_arrays], before)[0]), fed.round_log.train.get("peer_bound", {})

    free, _ = moved(0.0)
    tiny, report = moved(1e-3)
    assert report["clipped"] == 4 and tiny <= 1e-3 * report["max_norm"] * 1.01 and tiny < free / 100


def test_sparse_uploads_are_bounded_on_their_own_positions() -> None:
    fed = InProcessFederation({"algorithm": "dmpfl", "dataset": "digits", "max-update-ratio": 2.0}, 3)
    strategy = fed.strategy
    names = list(strategy.global_named)
    prunable = strategy.prunable[0]
    mask = strategy.global_masks[prunable]
    ref = {
        name: strategy.global_named[name][mask] if name == prunable else strategy.global_named[name] for name in names
    }

    def upload(step: float) -> SimpleNamespace:
        values = {name: (ref[name] + step).astype(np.float32) for name in names}
        return SimpleNamespace(payload=(values, {prunable: mask}))

    replies = [upload(0.01), upload(0.01), upload(1.0)]  # the third's update is 100x the others'
    strategy.bound_uploads(replies)
    assert strategy.peer_bound["clipped"] == 1
    for reply in replies[:2]:
        assert all(np.allclose(reply.payload[0][n], ref[n] + 0.01) for n in names), "the honest ones are kept"
    shortened = replies[2].payload[0]
    assert all(np.allclose(shortened[n], ref[n] + 0.02, atol=1e-6) for n in names), "twice the others' norm"
    assert replies[2].payload[1][prunable] is mask


def test_the_summary_counts_the_shortened_updates() -> None:
    from server_app.results import render_markdown, summarize

    records = [
        {
            "round": r,
            "wall_s": 1.0,
            "aggregate_s": 0.001,
            "bytes": dict.fromkeys(("train_down", "train_up", "eval_down", "eval_up"), 0),
            "train": {
                "used": 2,
                "sent": 2,
                **({"peer_bound": {"ratio": 3.0, "clipped": c, "max_norm": 1.0}} if c else {}),
            },
        }
        for r, c in ((1, 2), (2, 0), (3, 1))
    ]
    summary = summarize(records, {"algorithm": "dmpfl", "num_clients": 2})
    assert summary["peer_bound"] == {"ratio": 3.0, "clipped": 3}
    assert "| updates shortened by max-update-ratio 3 (all rounds) | 3 |" in render_markdown(summary)


def test_colluders_may_send_their_update_reversed() -> None:
    assert parse_run_config({"attack-clients": 0.15, "attack-boost": -1}).attack_boost == -1.0
    with pytest.raises(ConfigError, match="'attack-boost' = -0.5 must be at least 1 in size"):
        parse_run_config({"attack-boost": -0.5})


def test_a_walker_uploads_what_it_received_plus_a_fixed_direction_scaled_by_its_own_update() -> None:
    from common.methods.robust import walk_direction, walked_upload

    received = {"a": np.zeros(3, np.float32), "b": np.ones(2, np.float32)}
    upload = {"a": np.array([3.0, 0, 0], np.float32), "b": np.array([1.0, 5.0], np.float32), "extra": np.ones(1)}
    walked = walked_upload(upload, received, 0.5, seed=7)
    step = np.concatenate([walked["a"] - received["a"], walked["b"] - received["b"]])
    assert np.allclose(step, 2.5 * walk_direction(5, 7), atol=1e-6), "half of its update's length (5), seeded"
    assert walked["extra"] is upload["extra"], "what it did not receive is sent as it is"
    again = walked_upload(upload, received, 0.5, seed=7)
    assert all(np.array_equal(walked[k], again[k]) for k in walked), "the same direction every round"


def test_the_walk_attack_is_a_simulation_of_the_averaging_and_mixing_algorithms() -> None:
    assert parse_run_config({"algorithm": "heurfedamp", "attack-clients": 0.1, "attack-walk": 0.5}).attack_walk == 0.5
    with pytest.raises(ConfigError, match="'attack-walk' makes the attackers walk: set 'attack-clients'"):
        parse_run_config({"attack-walk": 0.5})
    with pytest.raises(ConfigError, match="'attack-clients' applies to the algorithms whose server averages or mixes"):
        parse_run_config({"algorithm": "fedfomo", "attack-clients": 0.1})


def test_one_walker_drags_the_others_cloud_models_through_the_per_round_bound() -> None:
    """HeurFedAMP, one walker of five, max-update-ratio 3: the bound shortens nothing, and the honest clients' u_i
    move along the walker's direction every round (docs/robustness.md: what no per-round or relative bound stops)."""
    raw = {"algorithm": "heurfedamp", "dataset": "digits", "num-rounds": 6, "fraction-train": 1.0}
    fed = InProcessFederation({**raw, "max-update-ratio": 3.0, "attack-clients": 0.2, "attack-walk": 0.5}, 5)
    fed.warmup()
    walked = []
    for rnd in range(1, 7):
        fed.train_round(rnd)
        walked.append(fed.strategy.round_record(rnd)["walk"]["honest_cloud"])
        assert fed.round_log.train["peer_bound"]["clipped"] == 0
    assert all(b > a for a, b in zip(walked[1:], walked[2:])), walked


def test_the_global_model_is_measured_along_the_walk_in_the_averaging_algorithms() -> None:
    """One walker of two, a step of its own update's length: the global model moves along the direction about half
    that step a round; with the walker's step 0.001 (no walk to speak of) it barely moves along it."""

    def walked(step: float) -> float:
        raw = {"algorithm": "fedavg", "dataset": "digits", "attack-clients": 0.5, "attack-walk": step}
        fed = InProcessFederation(raw, 2)
        before = fed.strategy.round_record(0)["walk"]["global"]
        for rnd in (1, 2):
            fed.train_round(rnd)
        return fed.strategy.round_record(2)["walk"]["global"] - before

    assert walked(1.0) > 5 * abs(walked(0.001)) and walked(1.0) > 0
    assert InProcessFederation({"algorithm": "fedavg", "dataset": "digits"}, 2).strategy.round_record(1) == {}
    with pytest.raises(ConfigError, match="'attack-walk' walks the whole model; fedper shares only part of it"):
        parse_run_config({"algorithm": "fedper", "attack-clients": 0.1, "attack-walk": 0.5})


def test_a_deployment_at_a_constant_learning_rate_is_told_a_walk_has_no_end() -> None:
    from common.methods.robust import walk_unbounded

    assert "lr-decay below 1 makes that walk's total finite" in (walk_unbounded("heurfedamp", True, 1.0) or "")
    assert walk_unbounded("heurfedamp", True, 0.99) is None, "a decaying rate: the per-round bounds' sum is finite"
    assert walk_unbounded("fedfomo", False, 1.0) is None, "nothing averaged or mixed by the server"
