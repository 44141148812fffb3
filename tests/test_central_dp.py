"""Run-config `dp` = central on the real round runner: the new global model is exactly the reference plus the
clipped, noised DP-FedAvg mean of what the clients sent, every round logs the epsilon the accountant gives, the
summary reports it, and settings that cannot give the guarantee are refused in one line."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from common.config import parse_run_config
from common.hparams import ConfigError
from common.methods.privacy import AdaptiveClip, CentralDp, epsilon, local_dp_epsilon, poisson_sample
from common.wire.messages import ARRAYS

from .inprocess import InProcessFederation

pytest.importorskip("dp_accounting")

BASE = {"dataset": "digits", "num-rounds": 3, "fraction-train": 0.5, "local-epochs": 1, "seed": 4, "eval-every": 0}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"algorithm": "fedamp"}, "cannot apply to 'fedamp': its server needs each client's own model"),
        ({"algorithm": "fliu"}, "cannot apply to 'fliu'"),
        ({"dp-noise-multiplier": 1.0, "dp-target-epsilon": 4.0}, "needs exactly one of"),
        ({}, "needs exactly one of"),
        ({"dp-noise-multiplier": 1.0, "robust-aggregation": "median"}, "no bounded sensitivity"),
        ({"dp": "local", "dp-target-epsilon": 4.0}, "must not take its noise from the server"),
        ({"dp": "local", "algorithm": "fedamp", "dp-noise-multiplier": 1.0}, "not yet for 'fedamp'"),
    ],
)
def test_settings_that_cannot_keep_the_promise_are_refused(extra: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_run_config({"dp": "central", **extra})
    parse_run_config({"dp": "local", "dp-noise-multiplier": 1.0, "robust-aggregation": "median"})  # the client's


def test_the_round_aggregate_is_the_clipped_noised_mean_and_the_epsilon_the_accountants() -> None:
    raw = {**BASE, "dp": "central", "dp-clip-norm": 0.05, "dp-noise-multiplier": 1.1, "dp-delta": 1e-4}
    raw["dp-noise-seed"] = 11  # a study's fixed noise: the test can draw it again
    fed = InProcessFederation(raw, 6)
    reference = [a.copy() for a in fed.strategy.global_arrays]
    replies = fed.train_round(1)
    uploads = [[np.asarray(a) for a in replies[pid][ARRAYS].to_numpy_ndarrays()] for pid in sorted(replies)]
    assert sorted(replies) == poisson_sample(range(6), 0.5, 11, 1) == [3, 4]  # a Poisson sample, 3 expected
    dp = CentralDp(1.1, 0.0, 1e-4, 3, 6, 3, 11)
    expected, report = dp.aggregate(uploads, reference, 0, 0.05)
    for got, want in zip(fed.strategy.global_arrays, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    record = fed.round_log.train
    assert record["dp"]["clipped"] == 2, "every update of a trained MLP is longer than 0.05"
    assert record["dp"]["noise_std"] == pytest.approx(1.1 * 0.05 / 3)
    assert record["dp"]["epsilon"] == pytest.approx(epsilon(1.1, 0.5, 1, 1e-4)) == report["epsilon"]
    fed.train_round(2)
    assert fed.round_log.train["dp"]["epsilon"] == pytest.approx(epsilon(1.1, 0.5, 2, 1e-4))
    state = fed.strategy.state_dict()
    assert state["dp-rounds"] == 2 and state["dp-noise-seed"] == 11  # a resumed run goes on with both


def test_the_noise_is_secret_unless_a_study_fixes_its_seed() -> None:
    """The run seed is in config.json for anyone to read: noise drawn from it could be subtracted. By default the
    server draws a secret (kept in its checkpoint); runs of the same run seed then differ by their noise only."""
    raw = {**BASE, "num-rounds": 1, "dp": "central", "dp-noise-multiplier": 1.0}
    models = []
    for noise_seed in (0, 0, 5, 5):
        fed = InProcessFederation({**raw, "dp-noise-seed": noise_seed}, 4)
        fed.train_round(1)
        models.append([a.copy() for a in fed.strategy.global_arrays])
        if noise_seed == 0:
            assert fed.strategy.state_dict()["dp-noise-seed"] != 0  # the secret, for a resume
    assert not all(np.array_equal(a, b) for a, b in zip(models[0], models[1])), "secret noise differs"
    assert all(np.array_equal(a, b) for a, b in zip(models[2], models[3])), "a fixed noise seed repeats"


def test_a_run_solves_the_noise_for_its_target_and_reports_the_epsilon(tmp_path: Path, capsys) -> None:
    from experiments import cli

    argv = ["run", "--set", "dp=central", "--set", "dp-target-epsilon=8", "--set", "dp-clip-norm=0.5"]
    assert cli.main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "central DP: updates clipped to 0.5, noise multiplier" in out and "(solved for epsilon 8)" in out
    run = tmp_path / "fedavg-digits-smoke" / "fedavg-digits-smoke-seed0"
    import json

    summary = json.loads((run / "summary.json").read_text())
    spent = summary["dp"]["epsilon"]
    assert summary["dp"]["rounds"] == 2 and spent <= 8.0 and spent == pytest.approx(8.0, rel=0.01)
    assert "| DP epsilon " in out.split("[round 2/2]")[1].splitlines()[0]
    assert "central DP: epsilon at delta 1e-05 of the run after 2 rounds" in (run / "summary.md").read_text()


@pytest.mark.parametrize("algorithm", ["fedper", "lg-fedavg", "ditto"])
def test_partial_and_personal_algorithms_aggregate_their_shared_part_under_dp(algorithm: str) -> None:
    fed = InProcessFederation({**BASE, "algorithm": algorithm, "dp": "central", "dp-noise-multiplier": 1.0}, 4)
    fed.train_round(1)
    report = fed.round_log.train["dp"]
    assert report["epsilon"] == pytest.approx(epsilon(1.0, 0.5, 1, 1e-5)) and report["noise_std"] == 0.5


def test_local_dp_clients_clip_and_noise_their_own_update_and_the_server_counts_their_uploads() -> None:
    raw = {**BASE, "dp": "local", "dp-clip-norm": 0.05, "dp-noise-multiplier": 0.8, "dp-noise-seed": 3}
    fed = InProcessFederation(raw, 4)
    received = [a.copy() for a in fed.strategy.global_arrays]
    replies = fed.train_round(1)
    for pid, reply in replies.items():
        sent = [np.asarray(a, np.float64) for a in reply[ARRAYS].to_numpy_ndarrays()]
        update = np.concatenate([(s - r).ravel() for s, r in zip(sent, received)])
        # clipped to 0.05, then noise of std 0.04 on each of the MLP's ~9,600 coordinates
        assert np.std(update) == pytest.approx(0.8 * 0.05, rel=0.05), pid
    report = fed.round_log.train["dp"]
    assert report["mode"] == "local" and report["uploads_max"] == 1
    # replace-one adjacency: the update moves by up to 2C, so z = 0.8 is a mechanism of multiplier 0.4; no
    # amplification by sampling (the server knows who took part)
    assert (
        report["epsilon"] == pytest.approx(epsilon(0.4, 1.0, 1, 1e-5)) == pytest.approx(local_dp_epsilon(0.8, 1, 1e-5))
    )
    assert report["epsilon"] > 2 * epsilon(0.8, 1.0, 1, 1e-5)
    fed.train_round(2)
    assert fed.round_log.train["dp"]["uploads_max"] in (1, 2)
    # an upload the server never aggregated (late, rejected, lost) still counts: every training message sent does
    fed.strategy.train_calls[0] = 7
    assert fed.strategy.count_local_dp([])["uploads_max"] == 7


def test_a_local_dp_upload_of_an_array_the_server_did_not_send_is_never_sent() -> None:
    from flwr.app import RecordDict

    from client_app.privacy import private_reply
    from common.wire.records import to_record

    settings = parse_run_config({"dp": "local", "dp-noise-multiplier": 1.0}).privacy
    content = RecordDict({ARRAYS: to_record(["w"], [np.zeros(3, np.float32)])})
    reply = RecordDict({ARRAYS: to_record(["w", "personal"], [np.ones(3, np.float32), np.ones(2, np.float32)])})
    with pytest.raises(ValueError, match=r"carries \['personal'\], which the server did not send"):
        private_reply(settings, content, reply, 0, 1)


def test_the_adaptive_bound_moves_toward_the_median_norm_and_the_budget_is_the_same() -> None:
    """Andrew et al.: the bound falls while most updates are under it and rises while most are over it; the
    count's noise takes a share of the budget, so the updates' multiplier is above the total one, and the
    accountant (the total one) reports the same epsilon as a fixed bound would."""
    raw = {**BASE, "num-rounds": 6, "fraction-train": 1.0, "dp": "central", "dp-noise-multiplier": 1.0}
    fed = InProcessFederation({**raw, "dp-noise-seed": 2, "dp-adaptive-clip": True, "dp-clip-norm": 50.0}, 8)
    steps = []
    for rnd in range(1, 5):
        fed.train_round(rnd)
        report = fed.round_log.train["dp"]
        steps.append((report["clip_bound"], 1 - report["clipped"] / 8, fed.strategy.dp_clip))
        assert report["epsilon"] == pytest.approx(epsilon(1.0, 1.0, rnd, 1e-5))
    # round 1: 8 of 8 under 50, the count noised with std 1 (1/8 on the fraction): a step near exp(-0.2 * 0.5)
    assert steps[0][0] == 50.0 and 50.0 * math.exp(-0.2 * 0.8) < steps[0][2] < 50.0 * math.exp(-0.2 * 0.2)
    for bound, under, following in steps:
        if abs(under - 0.5) >= 0.25:  # two noise stds from the target: the direction is sure
            assert (following < bound) == (under > 0.5), steps
    assert any(following > bound for bound, _, following in steps), "the noise grew the updates: the bound rose"
    assert fed.strategy.state_dict()["dp-clip"] == steps[-1][2]  # the next round's bound, for a resume
    assert fed.strategy.dp is not None and 1.0 < fed.strategy.dp.update_multiplier <= 1.155
    with pytest.raises(ConfigError, match="central DP's"):
        parse_run_config({"dp": "local", "dp-noise-multiplier": 1.0, "dp-adaptive-clip": True})


def test_supports_clip_what_each_client_sent_and_noise_lands_only_on_the_shared_coordinates() -> None:
    """Hand-made updates: the clip norm is taken on each update's support only, the mean divides by the planned
    clients, and off the shared mask the model stays the reference exactly."""
    reference = [np.zeros((40, 50)), np.zeros(3)]
    shared = [np.zeros((40, 50), bool), None]
    shared[0][:20] = True  # the global mask: the first 20 rows
    big = [np.full((40, 50), 3.0), np.zeros(3)]  # norm 3 * sqrt(1000) on the shared rows: clipped to 1
    own = [np.zeros((40, 50), bool), None]
    own[0][:10] = True  # sent rows 0-9 only: the rest of its update is off its support
    small = [np.full((40, 50), 0.01), np.full(3, 0.01)]  # within the bound on its support
    dp = CentralDp(0.0001, 0.0, 1e-5, 4, 40, 3, 5)
    new, report = dp.aggregate([big, small], reference, 0, 1.0, [shared, own], shared)
    assert report["clipped"] == 1
    scale = 1.0 / (3.0 * math.sqrt(1000))
    expect = np.zeros((40, 50))
    expect[:20] = 3.0 * scale / 4
    expect[:10] += 0.01 / 4
    np.testing.assert_allclose(new[0], expect, atol=1e-4)  # the noise: std 1e-4 * 1 / 4
    assert np.all(new[0][20:] == 0.0), "no noise and no update off the shared mask"
    np.testing.assert_allclose(new[1], np.full(3, 0.01 / 4), atol=1e-4)
    wide = CentralDp(2.0, 0.0, 1e-5, 4, 40, 3, 5).aggregate([big], reference, 0, 1.0, [shared], shared)[0][0]
    assert np.std(wide[:20] - 3.0 * scale / 4) == pytest.approx(2.0 * 1.0 / 4, rel=0.1)


@pytest.mark.parametrize(("algorithm", "extra"), [("dmpfl", {"dmpfl-phases": "halves"}), ("feddst", {})])
def test_sparse_algorithms_noise_only_their_global_mask_which_stays_as_it_started(algorithm: str, extra: dict) -> None:
    raw = {**BASE, "algorithm": algorithm, **extra, "dp": "central", "dp-clip-norm": 0.5, "dp-noise-multiplier": 1.0}
    raw["dp-noise-seed"] = 7
    fed = InProcessFederation(raw, 6)
    strategy = fed.strategy
    masks = {name: m.copy() for name, m in strategy.global_masks.items()}
    reference = [a.copy() for a in strategy.global_arrays]
    replies = fed.train_round(1)
    assert sorted(replies) == poisson_sample(range(6), 0.5, 7, 1) and replies
    for name, mask in strategy.global_masks.items():
        np.testing.assert_array_equal(mask, masks[name])  # no vote on the clients' masks
    # the same round by hand: each upload decoded, its update on (its mask AND m_g), noise on m_g
    names = [name for name, _ in strategy.specs]
    models, supports = [], []
    for pid in sorted(replies):
        weights, sent_masks = strategy.decode_upload(replies[pid], values_only=strategy.values_only_round(1))
        model, support = [], []
        for name, old in zip(names, reference):
            if name not in masks:
                model.append(weights[name])
                support.append(None)
                continue
            dense = np.zeros(old.shape, np.float32)
            dense[sent_masks[name]] = weights[name]
            on = sent_masks[name] & masks[name]
            model.append(np.where(on, dense, old))
            support.append(on)
        models.append(model)
        supports.append(support)
    shared = [masks.get(name) for name in names]
    expected, _ = CentralDp(1.0, 0.0, 1e-5, 3, 6, 3, 7).aggregate(models, reference, 0, 0.5, supports, shared)
    for name, got, want, old in zip(names, strategy.global_arrays, expected, reference):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-7)
        if name in masks:
            assert np.array_equal(got[~masks[name]], old[~masks[name]]), f"{name}: moved off m_g"
            assert not np.array_equal(got[masks[name]], old[masks[name]]), f"{name}: m_g did not train"
    report = fed.round_log.train["dp"]
    assert report["noise_std"] == pytest.approx(1.0 * 0.5 / 3)
    assert report["epsilon"] == pytest.approx(epsilon(1.0, 0.5, 1, 1e-5))


@pytest.mark.parametrize(("algorithm", "extra"), [("dmpfl", {"dmpfl-phases": "halves"}), ("feddst", {})])
def test_sparse_local_dp_noises_each_upload_on_what_it_carries_and_keeps_its_size(algorithm: str, extra: dict) -> None:
    """Under dp = local a DM-PFL / FedDST client clips and noises its update against theta_g on the positions it
    sends (its mask, the dense layers): the values move by noise of std z * C, the upload has exactly the arrays
    and sizes of the same round without DP, and the server reports each client's uploads."""
    from common.wire.codec import decode_model
    from common.wire.validation import record_to_numpy

    raw = {**BASE, "algorithm": algorithm, **extra, "dp-noise-seed": 5}
    plain = InProcessFederation(raw, 6)
    sent = plain.train_round(1)
    private = InProcessFederation({**raw, "dp": "local", "dp-clip-norm": 0.05, "dp-noise-multiplier": 0.8}, 6)
    start = {name: a.copy() for name, a in private.strategy.global_named.items()}
    masks = {name: m.copy() for name, m in private.strategy.global_masks.items()}
    noised = private.train_round(1)
    assert sorted(noised) == sorted(sent)
    for pid, reply in noised.items():
        arrays, without = record_to_numpy(reply[ARRAYS]), record_to_numpy(sent[pid][ARRAYS])
        assert {k: (a.dtype, a.shape) for k, a in arrays.items()} == {k: (a.dtype, a.shape) for k, a in without.items()}
        weights, upload_masks = decode_model(arrays, dict(private.strategy.specs), known_masks=masks)
        steps = []
        for name, values in weights.items():
            theta_g = start[name] * masks[name] if name in masks else start[name]
            on = upload_masks.get(name, np.ones(values.shape, bool))
            steps.append((values - theta_g)[on].ravel())
        assert np.std(np.concatenate(steps)) == pytest.approx(0.8 * 0.05, rel=0.05), pid
    report = private.round_log.train["dp"]
    assert report["mode"] == "local" and report["uploads_max"] == 1
    assert report["epsilon"] == pytest.approx(local_dp_epsilon(0.8, 1, 1e-5))  # replace-one: multiplier 0.4


@pytest.mark.parametrize(
    ("run", "floor", "why"),
    [
        ({}, 1.0, "only under local DP"),
        ({"dp": "central", "dp-noise-multiplier": 2.0}, 1.0, "only under local DP"),
        ({"dp": "local", "dp-noise-multiplier": 0.5}, 1.0, "0.5 is below this device's dp-noise-floor 1"),
        ({"dp": "local", "dp-noise-multiplier": 1.0, "dp-noise-seed": 9}, "1", "could be drawn again"),
        ({"dp": "local", "dp-noise-multiplier": 1.0}, "much", "must be a finite number"),
        ({"dp": "local", "dp-noise-multiplier": 1.0}, -1.0, "must be a finite number"),
        ({"dp": "local", "dp-noise-multiplier": 1.0}, 1.0, None),
        ({"dp": "local", "dp-noise-multiplier": 1.5}, "1.2", None),
        ({"dp": "local", "dp-noise-multiplier": 1.5, "dp-local-metrics": "report"}, 1.0, "needs withhold"),
        ({}, None, None),
        ({}, 0, None),
    ],
)
def test_a_device_with_a_noise_floor_takes_part_only_in_runs_that_meet_it(run: dict, floor: object, why: str) -> None:
    from client_app.privacy import below_floor

    got = below_floor(parse_run_config(run).privacy, floor)
    assert got is None if why is None else why in (got or "")


def test_a_device_below_its_floor_refuses_the_handshake_and_training_in_one_reply() -> None:
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.common.constant import ErrorCode

    from client_app.app import query, train
    from common.wire.messages import REASON, REFUSED

    class _Context:
        run_config = {"dataset": "digits", "dp": "central", "dp-noise-multiplier": 1.0}
        node_config = {"partition-id": 0, "num-partitions": 2, "dp-noise-floor": 0.8}
        state = RecordDict()

    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 2, 1
    handshake = Message(RecordDict({"config": ConfigRecord({"server-round": 0})}), dst_node_id=2, message_type="query")
    answer = query(handshake, _Context())  # type: ignore[arg-type]
    assert "only under local DP" in str(answer.content.config_records[REFUSED][REASON])
    msg = Message(RecordDict({"config": ConfigRecord({"server-round": 1})}), dst_node_id=2, message_type="train")
    reply = train(msg, _Context())  # type: ignore[arg-type]
    assert reply.has_error() and reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert "only under local DP" in reply.error.reason


def test_dapperfl_releases_the_clipped_noised_mean_of_its_recovered_updates() -> None:
    """Central DP for pruned uploads: each is recovered to full shape from the previous global model (its update is 0
    where it pruned), clipped to dp-clip-norm, averaged over the planned clients and noised on every coordinate."""
    raw = {**BASE, "algorithm": "dapperfl", "fraction-train": 1.0, "dp": "central", "dp-clip-norm": 0.05}
    fed = InProcessFederation({**raw, "dp-noise-multiplier": 1.1, "dp-noise-seed": 11}, 4)
    strategy = fed.strategy
    reference = [a.copy() for a in strategy.global_arrays]
    captured: dict = {}
    original = strategy.private_mean

    def recording(models, previous, supports=None, shared=None):
        captured["models"] = [[a.copy() for a in m] for m in models]
        return original(models, previous, supports, shared)

    strategy.private_mean = recording
    fed.train_round(1)
    assert len(captured["models"]) == 4
    dp = CentralDp(1.1, 0.0, 1e-5, 4, 4, 4, 11)
    expected, _ = dp.aggregate(captured["models"], reference, 0, 0.05)
    for got, want in zip(strategy.global_arrays, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    record = fed.round_log.train["dp"]
    assert record["clipped"] >= 1 and record["epsilon"] == pytest.approx(epsilon(1.1, 1.0, 1, 1e-5))
    norms = [
        np.sqrt(sum(float(np.sum((m - r) ** 2)) for m, r in zip(model, reference))) for model in captured["models"]
    ]
    assert record["clipped"] == sum(n > 0.05 for n in norms), "the clip counts the full-shape updates"


@pytest.mark.parametrize(("clip", "noise"), [(0.05, 0.8), (1e-3, 1e-9)])
def test_dapperfl_local_dp_bounds_the_update_the_server_recovers(clip: float, noise: float) -> None:
    """Under dp = local a DapperFL client clips and noises its pruned model's update against the global model cut to
    its kept channels (the update the server recovers, 0 where it pruned): with almost no noise the update's norm is
    the clip bound; with noise its entries move by z * C; the upload keeps its pruned shapes and masks."""
    from common.methods.channels import entry_indices, take
    from common.wire.messages import CHANNEL_MASKS
    from common.wire.validation import record_to_numpy

    raw = {**BASE, "algorithm": "dapperfl", "dp-noise-seed": 5}
    plain = InProcessFederation(raw, 4).train_round(1)
    fed = InProcessFederation({**raw, "dp": "local", "dp-clip-norm": clip, "dp-noise-multiplier": noise}, 4)
    start = {name: a.copy() for (name, _), a in zip(fed.strategy.specs, fed.strategy.global_arrays)}
    replies = fed.train_round(1)
    assert sorted(replies) == sorted(plain)
    for pid, reply in replies.items():
        arrays, without = record_to_numpy(reply[ARRAYS]), record_to_numpy(plain[pid][ARRAYS])
        assert {k: a.shape for k, a in arrays.items()} == {k: a.shape for k, a in without.items()}
        flags = record_to_numpy(reply[CHANNEL_MASKS])
        groups = fed.strategy.groups
        indices = entry_indices(groups, [flags[f"group-{i}"] > 0 for i in range(len(groups))], fed.strategy.specs)
        step = np.concatenate(
            [(np.asarray(a, np.float64) - take(start[k], indices.get(k, {}))).ravel() for k, a in arrays.items()]
        )
        if noise < 1e-6:
            assert np.linalg.norm(step) == pytest.approx(clip, rel=1e-2), pid
        else:
            assert np.std(step) == pytest.approx(noise * clip, rel=0.05), pid
    report = fed.round_log.train["dp"]
    assert report["mode"] == "local" and report["uploads_max"] == 1


def _fraction(new_bound: float, quantile: float = 0.5, lr: float = 0.2) -> float:
    """The noised fraction adaptive_clip_step used, read back from the bound it gave (old bound 1)."""
    return quantile - math.log(new_bound) / lr


def test_one_client_moves_the_adaptive_count_by_one_half() -> None:
    from common.methods.privacy import adaptive_clip_step

    rng = np.random.default_rng(0)
    below = [True] * 25 + [False] * 15
    for extra in (True, False):
        without = _fraction(adaptive_clip_step(1.0, below, 0.5, 0.2, 0.0, rng, 40))
        with_one = _fraction(adaptive_clip_step(1.0, [*below, extra], 0.5, 0.2, 0.0, rng, 40))
        assert (with_one - without) * 40 == pytest.approx(0.5 if extra else -0.5)  # shifted indicators: +-1/2
    assert without == pytest.approx(25 / 40)  # no noise: the fraction below, over the planned clients


@pytest.mark.parametrize(
    ("z", "clients", "per_round", "rounds"),
    [(1.0, 1000, 100, 30), (0.8, 1000, 100, 30), (2.5, 100, 10, 30), (1.2, 400, 20, 100)],
)
def test_adaptive_clipping_is_accounted_as_the_accountant_composes_its_two_mechanisms(
    z: float, clients: int, per_round: int, rounds: int
) -> None:
    """The updates (sensitivity C, noise std z_u C) and the count of the shifted indicators (sensitivity 1/2, noise
    std sigma_b: multiplier 2 sigma_b) are two Gaussian mechanisms on each sampled round: composed by dp-accounting,
    their epsilon is the run's. Read with the count's sensitivity 1 (the raw indicators), it would be larger: the
    under-report this guards against."""
    import dp_accounting
    from dp_accounting import rdp

    from common.methods.privacy import RDP_ORDERS

    dp = CentralDp(z, 0.0, 1e-5, per_round, clients, rounds, 1, AdaptiveClip(0.5, 0.2, 0.0))
    assert dp.adaptive is not None and dp.adaptive.count_noise_std == max(per_round / 20, z)

    def composed(count_multiplier: float) -> float:
        accountant = rdp.RdpAccountant(orders=list(RDP_ORDERS))
        both = dp_accounting.ComposedDpEvent(
            [dp_accounting.GaussianDpEvent(dp.update_multiplier), dp_accounting.GaussianDpEvent(count_multiplier)]
        )
        step = dp_accounting.PoissonSampledDpEvent(per_round / clients, both)
        accountant.compose(dp_accounting.SelfComposedDpEvent(step, rounds))
        return float(accountant.get_epsilon(1e-5))

    sigma_b = dp.adaptive.count_noise_std
    assert dp.epsilon(rounds) == pytest.approx(composed(2 * sigma_b), rel=1e-6)
    assert composed(sigma_b) > dp.epsilon(rounds) * 1.01  # the raw count's reading: a larger, true epsilon


def test_a_target_epsilon_with_few_clients_sets_the_documented_count_noise_and_runs() -> None:
    """With 10 clients a round at epsilon 1 the solved z is above 2: the count noise is max(m / 20, z) = z (it was
    max(m / 20, 1) = 1, whose budget split had no room left and crashed the first aggregation)."""
    dp = CentralDp(0.0, 1.0, 1e-5, 10, 100, 30, 1, AdaptiveClip(0.5, 0.2, 0.0))
    assert dp.noise_multiplier > 2 and dp.adaptive is not None
    assert dp.adaptive.count_noise_std == dp.noise_multiplier
    assert dp.update_multiplier == pytest.approx(dp.noise_multiplier / math.sqrt(0.75))
    assert dp.epsilon(30) <= 1.0


def test_a_budget_the_clients_cannot_meet_stops_the_run_before_any_training() -> None:
    from server_app.clients import RunAborted

    fed = InProcessFederation({**BASE, "dp": "central", "dp-target-epsilon": 1e-4}, 4)
    with pytest.raises(RunAborted, match="central DP: no noise multiplier up to 1e4 reaches epsilon"):
        fed.strategy.prepare()
    assert fed.strategy.train_calls == {}  # nothing was sent


def _updates(count: int, rng: np.random.Generator, shape: tuple[int, ...] = (30,)) -> list[list[np.ndarray]]:
    """Models around a zero reference whose update norms spread over 0.1 to 4."""
    out = []
    for _ in range(count):
        step = rng.standard_normal(shape)
        out.append([(step / np.linalg.norm(step) * rng.uniform(0.1, 4.0)).astype(np.float32)])
    return out


SETTINGS = [
    ({}, None),
    ({"robust-aggregation": "clip", "robust-clip-norm": 0.5}, None),
    ({"robust-aggregation": "clip", "robust-clip-norm": 3.0}, None),
    ({"max-weight-ratio": 4.0}, None),
    ({"robust-aggregation": "clip"}, "robust-clip-norm 0"),
    ({"robust-aggregation": "trimmed-mean"}, "no bounded sensitivity"),
    ({"robust-aggregation": "median"}, "no bounded sensitivity"),
    ({"max-update-ratio": 3.0}, "max-update-ratio > 0"),
    ({"max-update-ratio": 3.0, "robust-aggregation": "clip", "robust-clip-norm": 1.0}, "max-update-ratio > 0"),
]


@pytest.mark.parametrize(("extra", "refused"), SETTINGS)
def test_adding_one_client_to_forty_moves_the_clipped_sum_by_at_most_c(extra: dict, refused: str | None) -> None:
    """Every setting dp = central accepts keeps one client's effect on the clipped sum within C; every setting
    that would let one client rescale the others is refused in one line."""
    from common.methods.privacy import clipped_sum

    raw = {**BASE, "dp": "central", "dp-noise-multiplier": 1.0, "dp-clip-norm": 1.0, **extra}
    if refused is not None:
        with pytest.raises(ConfigError, match=refused):
            parse_run_config(raw)
        return
    strategy = InProcessFederation({**raw, "fraction-train": 1.0}, 4).strategy
    rng = np.random.default_rng(7)
    reference = [np.zeros(30, np.float32)]
    others = _updates(40, rng)
    every = [[None]] * 41
    for newcomer in ([np.full(30, 100.0, np.float32)], [np.full(30, 0.01, np.float32)], _updates(1, rng)[0]):
        before, _ = strategy.dp_contributions(others, reference)
        after, _ = strategy.dp_contributions([*others, newcomer], reference)
        sum_before, _ = clipped_sum(
            [[np.asarray(a) - r for a, r in zip(m, reference)] for m in before], every[:40], 1.0
        )
        sum_after, _ = clipped_sum([[np.asarray(a) - r for a, r in zip(m, reference)] for m in after], every, 1.0)
        moved = math.sqrt(sum(float(np.sum((a - b) ** 2)) for a, b in zip(sum_after, sum_before)))
        assert moved <= 1.0 + 1e-6, (extra, moved)


def test_a_poisson_sample_takes_each_client_independently_and_from_its_seed_alone() -> None:
    """What the accountant composes: each client in each round with probability q, independently, so the round's
    size varies (and may be 0); the draw repeats for one (seed, round) and is a function of that seed only."""
    ids, q, rounds = list(range(40)), 0.1, 2000
    samples = [poisson_sample(ids, q, 99, r) for r in range(rounds)]
    counts = np.bincount(np.concatenate([np.asarray(s, int) for s in samples]), minlength=40)
    # each client's count is Binomial(2000, 0.1): mean 200, std 13.4; 5 std either way
    assert counts.min() > 200 - 5 * 13.4 and counts.max() < 200 + 5 * 13.4
    sizes = np.array([len(s) for s in samples])
    assert sizes.mean() == pytest.approx(4.0, abs=0.3) and sizes.var() == pytest.approx(3.6, rel=0.2)
    assert (sizes == 0).mean() == pytest.approx(0.9**40, abs=0.01)  # an empty round happens (1.5%)
    together = np.mean([(3 in s) and (7 in s) for s in samples])
    assert together == pytest.approx(q * q, abs=0.01), "two clients are drawn independently"
    assert poisson_sample(ids, q, 99, 5) == samples[5] and poisson_sample(ids, q, 98, 5) != samples[5]
    assert poisson_sample(ids, 1.0, 1, 1) == ids
    with pytest.raises(ValueError, match="sample rate"):
        poisson_sample(ids, 0.0, 1, 1)


def test_central_dp_samples_from_the_secret_seed_not_from_the_run_seed() -> None:
    """A sample drawn from the run seed (config.json) would tell anyone which rounds a client took part in. Under
    dp = central the same run seed with another noise seed samples other clients; the same noise seed under another
    run seed samples the same ones; without dp the sample is the run seed's fixed-size one."""
    raw = {**BASE, "dp": "central", "dp-noise-multiplier": 1.0, "fraction-train": 0.25}

    def rounds(extra: dict) -> list[list[int]]:
        fed = InProcessFederation({**raw, **extra}, 12)
        return [fed.strategy.sample(r) for r in range(1, 9)]

    a, b = rounds({"dp-noise-seed": 3}), rounds({"dp-noise-seed": 4})
    assert a != b and a == rounds({"dp-noise-seed": 3, "seed": 99})
    assert a == [poisson_sample(range(12), 0.25, 3, r) for r in range(1, 9)]
    assert len({len(s) for s in a + b}) > 1, "the round's size varies around the planned 3"
    plain = InProcessFederation({**BASE, "fraction-train": 0.25}, 12)
    assert {len(plain.strategy.sample(r)) for r in range(1, 9)} == {3}


def _empty_round_seed(clients: int, rate: float) -> int:
    return next(s for s in range(1, 10_000) if not poisson_sample(range(clients), rate, s, 1))


@pytest.mark.parametrize(
    ("algorithm", "extra"),
    [
        ("fedavg", {}),
        ("fedper", {}),
        ("dmpfl", {"dmpfl-phases": "halves"}),
        ("feddst", {}),
        ("dapperfl", {}),
        ("fedavg", {"dp-adaptive-clip": True}),
    ],
)
def test_an_empty_poisson_sample_still_releases_the_noise_and_counts_the_round(algorithm: str, extra: dict) -> None:
    """Each round must be the mechanism the accountant composes, whoever took part: a round whose sample is empty
    releases the reference plus the noise (never the model unchanged, which an observer could tell apart from a
    round with one client), and counts for epsilon."""
    seed = _empty_round_seed(4, 0.5)
    raw = {**BASE, "algorithm": algorithm, **extra, "dp": "central", "dp-noise-multiplier": 1.0}
    fed = InProcessFederation({**raw, "dp-clip-norm": 0.5, "dp-noise-seed": seed}, 4)
    strategy = fed.strategy
    reference = [a.copy() for a in strategy.global_arrays]
    masks = {name: m.copy() for name, m in getattr(strategy, "global_masks", {}).items()}
    assert fed.train_round(1) == {} and fed.round_log.train["sent"] == 0
    names = [name for name, _ in strategy.specs]
    shared = [masks.get(name) for name in names]
    if algorithm == "fedper":  # the shared part (the body) is what is noised; the head stays
        shared_names = set(strategy.shared)
        shared = [None if name in shared_names else np.zeros(ref.shape, bool) for name, ref in zip(names, reference)]
    adaptive = AdaptiveClip(0.5, 0.2, 0.0) if extra.get("dp-adaptive-clip") else None
    dp = CentralDp(1.0, 0.0, 1e-5, 2, 4, 3, seed, adaptive)
    expected, report = dp.aggregate([], reference, 0, 0.5, [], shared)
    for name, got, want in zip(names, strategy.global_arrays, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-7, err_msg=name)
    assert any(not np.array_equal(g, r) for g, r in zip(strategy.global_arrays, reference)), "noise was released"
    record = fed.round_log.train["dp"]
    assert record["epsilon"] == pytest.approx(epsilon(1.0, 0.5, 1, 1e-5)) and record["clipped"] == 0
    assert strategy.state_dict()["dp-rounds"] == 1
    if adaptive is not None:
        assert strategy.dp_clip == report["next_clip_bound"] != 0.5, "the count's noise was drawn too"


def test_local_dp_clients_withhold_every_statistic_of_their_data_unless_a_study_asks() -> None:
    """Under dp = local the epsilon covers the noised uploads alone, so by default a client reports nothing else of
    its data: a handshake of fixed counts, training replies of fixed metrics (uniform weights, no loss), and no
    evaluation, which the server therefore never asks for. `report` (a simulation study) sends the real ones."""
    from client_app.privacy import WITHHELD_COUNT, WITHHELD_TRAIN_METRICS
    from common.wire.messages import METRICS

    raw = {**BASE, "dp": "local", "dp-clip-norm": 0.05, "dp-noise-multiplier": 0.8, "eval-every": 1}
    fed = InProcessFederation(raw, 4)
    assert {fed.clients.by_partition[pid].num_train for pid in fed.clients.ids()} == {WITHHELD_COUNT}
    assert {fed.clients.by_partition[pid].num_test for pid in fed.clients.ids()} == {WITHHELD_COUNT}
    replies = fed.train_round(1)
    assert replies
    for reply in replies.values():
        metrics = dict(reply.metric_records[METRICS])
        assert {k: metrics[k] for k in WITHHELD_TRAIN_METRICS} == WITHHELD_TRAIN_METRICS
        assert set(metrics) - set(WITHHELD_TRAIN_METRICS) <= {"server-round", "phase"}, "only the echoed round"
    train = fed.round_log.train
    assert math.isnan(train["loss"]) and train["dp"]["metrics"] == "withheld"
    assert not fed.runner.should_evaluate(1)
    assert fed.evaluate(1) == {} and fed.runner.round_log.eval is None, "asked anyway, every client refuses"
    reported = InProcessFederation({**raw, "dp-local-metrics": "report"}, 4)
    assert reported.clients.by_partition[0].num_train > 1 and reported.runner.should_evaluate(1)
    metrics = dict(next(iter(reported.train_round(1).values())).metric_records[METRICS])
    assert metrics["num-examples"] > 1 and metrics["train-loss"] > 0
    assert reported.round_log.train["dp"]["metrics"] == "reported without noise, outside epsilon"


def test_a_withholding_client_refuses_to_evaluate_whatever_the_server_asks() -> None:
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.common.constant import ErrorCode
    from flwr.supercore.task_identity import TaskIdentity

    from client_app.app import evaluate

    class _Context:
        run_config = {"dataset": "digits", "dp": "local", "dp-noise-multiplier": 1.0}
        node_config = {"partition-id": 0, "num-partitions": 2}
        state = RecordDict()

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 2, 1
    msg = Message(RecordDict({"config": ConfigRecord({"server-round": 1})}), dst_node_id=2, message_type="evaluate")
    reply = evaluate(msg, _Context())  # type: ignore[arg-type]
    assert reply.has_error() and reply.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    assert "evaluation withheld" in reply.error.reason


def test_a_local_dp_run_says_its_metrics_are_withheld(tmp_path: Path, capsys) -> None:
    import json

    from experiments import cli

    argv = ["run", "--set", "dp=local", "--set", "dp-noise-multiplier=1.0", "--set", "dp-clip-norm=0.5"]
    assert cli.main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "local DP: the clients withhold every statistic of their data" in out
    assert "loss withheld" in out.split("[round 2/2]")[1].splitlines()[0]
    run = tmp_path / "fedavg-digits-smoke" / "fedavg-digits-smoke-seed0"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["dp"]["metrics"] == "withheld" and summary["dp"]["mode"] == "local"
    assert "| local DP: the clients' loss, counts and evaluations | withheld |" in (run / "summary.md").read_text()


def _pushed_bound(band: float, colluders: int, rounds: int = 60) -> tuple[float, bool]:
    """The highest adaptive clip bound over `rounds` rounds in which `colluders` of 10 upload updates far longer
    than any bound (so none is counted under it) and the others updates of norm 1, starting at 1; whether the band
    held it."""
    dp = CentralDp(1.0, 0.0, 1e-5, 10, 10, rounds, 3, AdaptiveClip(0.5, 1.0, 0.0, 1.0 / band, band))
    bound, highest, reached = 1.0, 1.0, False
    for index in range(rounds):
        models = [[np.array([1.0 if i >= colluders else 1e6], np.float32)] for i in range(10)]
        _, report = dp.aggregate(models, [np.zeros(1, np.float32)], index, bound)
        bound, reached = float(report["next_clip_bound"]), reached or bool(report.get("clip_band_reached"))
        highest = max(highest, bound)
    return highest, reached


def test_a_colluding_majority_steers_the_adaptive_bound_only_within_the_band() -> None:
    """6 colluders of 10 push the count down every round: without a band the bound grows without end; with
    dp-clip-band 4 it stops at 4 x dp-clip-norm and the round says so. A minority of 3 cannot take it far even
    without a band: the honest norms (all 1 here) hold the median."""
    free, free_reached = _pushed_bound(math.inf, 6)
    banded, banded_reached = _pushed_bound(4.0, 6)
    assert free > 50.0 and not free_reached
    assert banded == pytest.approx(4.0, rel=1e-12) and banded_reached
    minority, _ = _pushed_bound(math.inf, 3)
    assert minority < 2.0, "3 of 10: above 1 the 7 honest updates (norm 1) are under it and pull it back"


def test_the_band_is_a_run_config_key_with_a_floor_of_one() -> None:
    assert parse_run_config({"dp": "central", "dp-noise-multiplier": 1.0, "dp-clip-band": 2.5}).dp_clip_band == 2.5
    with pytest.raises(ConfigError, match="dp-clip-band"):
        parse_run_config({"dp": "central", "dp-noise-multiplier": 1.0, "dp-clip-band": 0.5})
