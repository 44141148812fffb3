"""FedAMP, HeurFedAMP, FLIU and FedFomo in-process: exact payloads, state, stage metrics, faults."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import ConfigRecord, MessageType, RecordDict

from client_app.algorithms import answer
from client_app.algorithms.fedamp import CLOUD_MODEL as CLOUD
from client_app.algorithms.local import PERSONAL
from common.algorithms import SPECS
from common.config import ConfigError, parse_run_config
from common.learning.models import get_arrays
from common.learning.stages import STAGE_KEYS, stage_key, summarize_stages
from common.methods.attention import ModelMatrix, _gram, fedamp_weights, heurfedamp_weights
from common.methods.fliu import adaptive_gamma, individualized_update
from common.methods.fomo import choose_peers, fomo_combine, fomo_weights
from common.wire.records import flatten, to_record
from server_app.faults import choose_faulty

from .fakes import FakeReply, hand_made_runner, train_content
from .inprocess import InProcessFederation


def _federation(algorithm: str, num_clients: int = 4, **overrides) -> InProcessFederation:
    raw = {
        "algorithm": algorithm,
        "dataset": "digits",
        "num-rounds": 4,
        "fraction-train": 0.5,
        "local-epochs": 1,
        "lr": 0.1,
        **overrides,
    }
    return InProcessFederation(raw, num_clients)


def _arrays(content: RecordDict, key: str = "arrays") -> list[np.ndarray]:
    return content.array_records[key].to_numpy_ndarrays()


# ----- the model matrix ------------------------------------------------------------------------------
def test_incremental_gram_equals_the_full_product() -> None:
    rng = np.random.default_rng(0)
    matrix = ModelMatrix(6, rng.normal(size=40))
    matrix.set_rows([1, 4], rng.normal(size=(2, 40)))
    matrix.set_rows([4, 0, 5], rng.normal(size=(3, 40)))
    np.testing.assert_allclose(matrix.G, _gram(matrix.W), rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(matrix.G, matrix.G.T)
    assert matrix.heard.tolist() == [True, True, False, False, True, True]
    with pytest.raises(ValueError, match="once per call"):
        matrix.set_rows([2, 2], rng.normal(size=(2, 40)))


def test_gram_matrix_does_not_depend_on_how_the_writes_were_split() -> None:
    rng = np.random.default_rng(5)
    initial, rows = rng.normal(size=30), rng.normal(size=(6, 30))
    at_once, in_windows = ModelMatrix(6, initial), ModelMatrix(6, initial)
    at_once.set_rows([0, 1, 2, 3, 4, 5], rows)
    in_windows.set_rows([4, 1], rows[[4, 1]])  # a pre-training round's windows, read only after the last
    in_windows.set_rows([0, 5, 2, 3], rows[[0, 5, 2, 3]])
    np.testing.assert_array_equal(in_windows.G, at_once.G)
    np.testing.assert_allclose(at_once.G, _gram(at_once.W), rtol=1e-12)
    in_windows.set_rows([2], rows[[2]] + 1.0)  # a row written after a read: brought up to date at the next one
    np.testing.assert_allclose(in_windows.G, _gram(in_windows.W), rtol=1e-12, atol=1e-9)


def test_rows_written_from_arrays_equal_rows_set_from_a_stack() -> None:
    rng = np.random.default_rng(3)
    initial = rng.normal(size=12)
    models = [[rng.normal(size=(2, 3)), rng.normal(size=6)] for _ in range(2)]
    stacked, direct = ModelMatrix(5, initial), ModelMatrix(5, initial)
    stacked.set_rows([3, 1], np.stack([np.concatenate([a.ravel(), b]) for a, b in models]))
    direct.set_rows_from_arrays([3, 1], models)
    np.testing.assert_array_equal(direct.W, stacked.W)
    np.testing.assert_array_equal(direct.G, stacked.G)
    assert direct.heard.tolist() == stacked.heard.tolist() == [False, True, False, True, False]
    with pytest.raises(ValueError, match="a model of 11 values for rows of 12"):
        direct.set_rows_from_arrays([0], [[np.zeros(11)]])
    with pytest.raises(ValueError, match="2 models for 1 rows"):
        direct.set_rows_from_arrays([0], models)


# ----- FedAMP / HeurFedAMP ---------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["fedamp", "heurfedamp"])
def test_each_client_receives_exactly_its_weighted_combination(algorithm: str) -> None:
    fed = _federation(algorithm, 4, **{"fedamp-sigma": 50.0, "heurfedamp-sigma": 5.0, "heurfedamp-tau": 0.6})
    strategy = fed.strategy
    matrix = strategy.ensure_matrix()
    rng = np.random.default_rng(1)
    matrix.set_rows([0, 1, 2, 3], matrix.W + 0.05 * rng.normal(size=matrix.W.shape).astype(np.float32))
    W = matrix.W.copy()
    xi = fedamp_weights(W, strategy.alpha_k(1), 50.0)[0] if algorithm == "fedamp" else heurfedamp_weights(W, 5.0, 0.6)
    shared = strategy.shared_payload(1)
    payloads = {pid: flatten(_arrays(strategy.train_content(1, pid, shared))) for pid in range(4)}
    for pid, u in payloads.items():
        expected = (xi[pid][:, None] * W.astype(np.float64)).sum(axis=0)
        # float32 GEMM against the float64 loop: equal up to float32 rounding of the sums
        np.testing.assert_allclose(u, expected, rtol=0, atol=1e-6)
    assert not np.array_equal(payloads[0], payloads[1]), "a different cloud model per client"
    config = strategy.train_content(1, 0, shared).config_records["config"]
    assert config["prox-mu"] == pytest.approx(strategy.amp.fedamp_lambda / strategy.alpha_k(1))


@pytest.mark.parametrize("algorithm", ["fedamp", "heurfedamp"])
def test_attention_over_the_round_gives_each_participant_the_mix_of_the_participants(algorithm: str) -> None:
    fed = _federation(algorithm, 6, **{"fedamp-attend": "round", "fedamp-sigma": 50.0, "heurfedamp-sigma": 5.0})
    strategy = fed.strategy
    matrix = strategy.ensure_matrix()
    assert matrix.G.shape == (0, 0), "no Gram matrix of every client is kept"
    rng = np.random.default_rng(2)
    matrix.set_rows(list(range(6)), matrix.W + 0.05 * rng.normal(size=matrix.W.shape).astype(np.float32))
    sampled = strategy.sample(1)
    rows = [strategy.rows[pid] for pid in sampled]
    W = matrix.W[rows].copy()
    xi = fedamp_weights(W, strategy.alpha_k(1), 50.0)[0] if algorithm == "fedamp" else heurfedamp_weights(W, 5.0, 0.95)
    shared = strategy.shared_payload(1)
    for at, pid in enumerate(sampled):
        u = flatten(_arrays(strategy.train_content(1, pid, shared)))
        np.testing.assert_allclose(u, (xi[at][:, None] * W.astype(np.float64)).sum(axis=0), rtol=0, atol=1e-6)
    assert sorted(strategy.artifacts()["attention_clients"].tolist()) == sorted(sampled)


def test_first_sampled_pretraining_spreads_round_0_and_leaves_unheard_rows_out_of_the_attention() -> None:
    fed = _federation("fedamp", 6, **{"pretrain-when": "first-sampled", "fedamp-sigma": 50.0})
    strategy = fed.strategy
    assert not strategy.warmup_round()
    assert not strategy.ensure_matrix().W.any(), "no row is filled before its client uploads"
    initial = flatten(strategy.global_arrays)
    fed.train_round(1)
    first = sorted(fed.sent[1])
    for pid in first:  # everyone is new in round 1: the common initialization, to pre-train from
        content = fed.sent[1][pid]
        assert content.config_records["config"]["pretrain"] is True
        np.testing.assert_array_equal(flatten(_arrays(content)), initial)
    assert strategy.round_record(1)["pretrained"] == len(first)
    matrix = strategy.matrix
    assert sorted(np.flatnonzero(matrix.heard).tolist()) == sorted(strategy.rows[pid] for pid in first)
    shared = strategy.shared_payload(2)
    heard = matrix.heard.copy()
    xi = fedamp_weights(matrix.W.copy(), strategy.alpha_k(2), 50.0, active=heard)[0]
    second = strategy.sample(2)
    assert 0 < sum(heard[strategy.rows[pid]] for pid in second) < len(second), "the seed gives both kinds"
    for pid in second:
        content = strategy.train_content(2, pid, shared)
        config = content.config_records["config"]
        if not heard[strategy.rows[pid]]:
            assert config["pretrain"] is True and "prox-mu" not in config
            continue
        assert "pretrain" not in config
        row = strategy.rows[pid]
        assert np.all(xi[row][~heard] == 0.0), "a row never uploaded gives no weight"
        expected = (xi[row][:, None] * matrix.W.astype(np.float64)).sum(axis=0)
        np.testing.assert_allclose(flatten(_arrays(content)), expected, rtol=0, atol=1e-6)


def test_fedamp_stores_uploads_as_rows_and_keeps_stale_ones() -> None:
    fed = _federation("fedamp", 4)
    before = fed.strategy.ensure_matrix().W.copy()
    replies = fed.train_round(1)
    matrix = fed.strategy.matrix
    for pid in range(4):
        row = fed.strategy.rows[pid]
        if pid in replies:
            np.testing.assert_array_equal(matrix.W[row], flatten(_arrays(replies[pid])))
        else:
            np.testing.assert_array_equal(matrix.W[row], before[row])
    np.testing.assert_allclose(matrix.G, _gram(matrix.W), rtol=1e-12, atol=1e-6)
    record = fed.strategy.round_record(1)
    assert record["stale_rows"] == 4 - len(replies) and record["never_heard"] == 4 - len(replies)
    # rows all equal before the first upload: distance 0, so xi_ij = alpha/sigma for each of the 3 others
    assert record["self_weight_median"] == pytest.approx(1 - 3 * fed.strategy.alpha_k(1) / 100.0)


def test_alpha_schedule_decays_every_period() -> None:
    strategy = _federation("fedamp", 2, **{"fedamp-alpha": 2.0, "fedamp-decay": 0.1, "fedamp-decay-every": 3}).strategy
    assert [strategy.alpha_k(k) for k in (1, 3, 4, 6, 7)] == pytest.approx([2.0, 2.0, 0.2, 0.2, 0.02])


def test_fedamp_guard_is_reported(caplog) -> None:
    fed = _federation("fedamp", 3, **{"fedamp-alpha": 1e6, "fedamp-sigma": 1.0})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        xi = fed.strategy.attention(1)
    assert fed.strategy.round_record(1)["guard"] is True
    np.testing.assert_allclose(xi.sum(axis=1), 1.0)
    assert np.all(np.diag(xi) == 0.0)


def test_fedamp_client_pulls_toward_its_cloud_model_and_keeps_it() -> None:
    fed = _federation("fedamp", 2)
    u = [a + 0.3 for a in fed.strategy.global_arrays]
    names = [n for n, _ in fed.strategy.specs]

    clients = [fed.client(0), fed.client(1)]

    def fit(mu: float, state_pid: int) -> list[np.ndarray]:
        content = RecordDict(
            {"arrays": to_record(names, u), "config": ConfigRecord({"server-round": 1, "prox-mu": mu})}
        )
        return _arrays(clients[state_pid].fit(1, content))

    free, pulled = fit(0.0, 0), fit(5.0, 1)
    dist = [float(sum(np.sum((a - b) ** 2) for a, b in zip(w, u))) for w in (free, pulled)]
    assert dist[1] < 0.5 * dist[0], "the proximal term carries gradient toward u_i"
    state = clients[1].env.state
    np.testing.assert_array_equal(flatten(state.load_arrays(CLOUD)), flatten(u))
    np.testing.assert_array_equal(flatten(state.load_arrays(PERSONAL)), flatten(pulled))
    reply = clients[1].evaluate(2, RecordDict({"config": ConfigRecord({"server-round": 2})}))
    metrics = reply.metric_records["metrics"]
    assert "cloud-acc-shift-0" in metrics and "acc-shift-0" in metrics


def test_fedamp_pretraining_message_trains_from_the_common_initialization() -> None:
    fed = _federation("fedamp", 2, **{"pretrain-epochs": 2})
    strategy = fed.strategy
    assert strategy.warmup_round(), "pre-training is round 0"
    content = strategy.train_content(0, 0, strategy.shared_payload(0))
    assert content.config_records["config"]["pretrain"] is True
    np.testing.assert_array_equal(flatten(_arrays(content)), flatten(strategy.global_arrays))
    reply = fed.client(0).fit(0, content)
    assert reply.metric_records["metrics"]["steps"] > 0
    assert fed.client(0).env.state.load_arrays(CLOUD) is None, "pre-training receives no cloud model"
    assert not _federation("fedamp", 2, **{"pretrain-epochs": 0}).strategy.warmup_round()


def test_pretraining_flops_count_in_round_one() -> None:
    fed = _federation("fedamp", 2)
    fed.round_log.train["pretrain"] = {"flops": 1234.0}
    replies = fed.train_round(1, fresh_log=False)
    trained = sum(r.metric_records["metrics"]["train-flops"] for r in replies.values())
    assert trained > 0 and fed.round_log.train["flops"] == pytest.approx(trained + 1234.0)
    replies = fed.train_round(2)
    assert fed.round_log.train["flops"] == pytest.approx(
        sum(r.metric_records["metrics"]["train-flops"] for r in replies.values())
    )


def test_fedamp_pull_is_stable_at_a_huge_coefficient() -> None:
    """lambda / alpha_k = 1e3 at lr 0.1 (100x past the gradient form's limit): w_i ends finite, next to u_i."""
    fed = _federation("fedamp", 1)
    u = [a + 0.3 for a in fed.strategy.global_arrays]
    names = [n for n, _ in fed.strategy.specs]
    content = RecordDict({"arrays": to_record(names, u), "config": ConfigRecord({"server-round": 1, "prox-mu": 1e3})})
    w = _arrays(fed.client(0).fit(1, content))
    assert all(np.isfinite(a).all() for a in w)
    distance = float(sum(np.sum((a - b) ** 2) for a, b in zip(w, u)))
    assert distance < 1e-3, distance


@pytest.mark.parametrize(
    ("algorithm", "key", "value"), [("fedprox", "proximal-mu", 25.0), ("ditto", "ditto-lambda", 20.0)]
)
def test_a_diverging_gradient_pull_is_one_clear_error(algorithm: str, key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"'lr' x '{key}'"):
        parse_run_config({"algorithm": algorithm, "lr": 0.1, key: value})
    parse_run_config({"algorithm": algorithm, "lr": 0.1, "momentum": 0.9, key: value})  # 2.5 < 2 (1 + 0.9)


def test_bad_fedamp_config_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="fedamp-alpha"):
        _federation("fedamp", 2, **{"fedamp-alpha": 0.0})


# ----- FLIU ------------------------------------------------------------------------------------------
def test_fliu_server_averages_uniformly_or_by_samples() -> None:
    specs = [("body.w", (2,))]
    for weighting, expected in (("uniform", 2.0), ("samples", 2.5)):
        cfg = parse_run_config({"algorithm": "fliu", "fliu-weighting": weighting})
        runner = hand_made_runner(cfg, specs, [np.zeros(2, np.float32)], {0: 10, 1: 30}, node_base=10)
        replies = [
            FakeReply(10, train_content(["body.w"], [np.full(2, 1.0, np.float32)], 10)),
            FakeReply(11, train_content(["body.w"], [np.full(2, 3.0, np.float32)], 30)),
        ]
        runner.aggregate_train(1, replies)
        np.testing.assert_allclose(runner.strategy.global_arrays[0], expected)
        config = runner.strategy.round_config(1, 0)
        assert config["total-samples"] == 40 and config["num-clients"] == 2


def test_fliu_client_individualizes_with_the_adaptive_gamma() -> None:
    fed = _federation("fliu", 4, partition="iid", stages=True)
    client = fed.client(2)
    theta_k = [a + 0.5 for a in fed.strategy.global_arrays]
    client.env.state.save_arrays(PERSONAL, theta_k)
    content = fed.strategy.train_content(1, 2, fed.strategy.shared_payload(1))
    n_total = fed.clients.total_train()
    gamma = adaptive_gamma(client.env.data.num_train, n_total, 4)
    mixed = individualized_update(theta_k, fed.strategy.global_arrays, gamma)
    individualized = client.individualized(client.received_model(content), content)
    np.testing.assert_array_equal(flatten(get_arrays(individualized)), flatten(mixed))
    reply = client.fit(1, content)
    metrics = reply.metric_records["metrics"]
    fliu_keys = {key for key in STAGE_KEYS if "+" not in key}  # L1+ / L2+ are DM-PFL+'s
    assert len(fliu_keys) == 6 and fliu_keys <= set(metrics)
    np.testing.assert_array_equal(flatten(client.env.state.load_arrays(PERSONAL)), flatten(_arrays(reply)))


def test_fliu_fixed_gamma_and_first_round_without_own_model() -> None:
    fed = _federation("fliu", 2, **{"fliu-gamma": 0.75})
    client = fed.client(0)
    content = fed.strategy.train_content(1, 0, fed.strategy.shared_payload(1))
    assert client.gamma(content) == 0.75
    first = client.individualized(client.received_model(content), content)
    np.testing.assert_array_equal(flatten(get_arrays(first)), flatten(fed.strategy.global_arrays))
    with pytest.raises(ConfigError, match="fliu-gamma"):
        _federation("fliu", 2, **{"fliu-gamma": 1.5})


# ----- stages ---------------------------------------------------------------------------------------
def test_stage_summary_means_sums_and_strict_rho() -> None:
    rows = [
        {stage_key("L1", "local"): 0.95, stage_key("L1", "global"): 0.5},
        {stage_key("L1", "local"): 0.80, stage_key("L1", "global"): 0.7},
        {stage_key("L2", "local"): 1.0, stage_key("L2", "global"): 0.2},
    ]
    out = summarize_stages(rows, (0.9, 0.95))
    assert set(out) == {"L1", "L2"}
    assert out["L1"]["acc_local"][0] == pytest.approx(0.875) and out["L1"]["acc"][0] == pytest.approx(1.475)
    assert out["L1"]["rho"] == {"0.9": 1, "0.95": 0}, "rho counts Acc(L) strictly above eps"
    assert out["L2"]["clients"] == 1


def test_stages_are_aggregated_per_round_only_when_enabled() -> None:
    on = _federation("fedavg", 4, stages=True)
    on.train_round(1)
    stages = on.round_log.train["stages"]
    assert set(stages) == {"G", "L1", "L2"}
    assert stages["G"]["acc_local"] == stages["L1"]["acc_local"], "FedAvg's L1 is the received global model"
    off = _federation("fedavg", 4)
    off.train_round(1)
    assert "stages" not in off.round_log.train


# ----- FedFomo --------------------------------------------------------------------------------------
def test_fomo_weights_and_combination_on_hand_made_numbers() -> None:
    weights = fomo_weights(1.0, [0.5, 1.5, 0.0], [1.0, 1.0, 4.0])
    assert weights == pytest.approx([0.5 / 0.75, 0.0, 0.25 / 0.75])
    assert fomo_weights(1.0, [2.0], [1.0]) == [0.0]
    own = [np.array([0.0, 0.0], np.float32)]
    peers = [[np.array([2.0, 0.0], np.float32)], [np.array([0.0, 4.0], np.float32)]]
    np.testing.assert_allclose(fomo_combine(own, peers, [0.5, 0.25])[0], [1.0, 1.0])


def test_choose_peers_greedy_and_random() -> None:
    affinity = np.array([0.0, 3.0, 1.0, 2.0, 0.0])
    rng = np.random.default_rng(0)
    assert choose_peers(affinity, np.array([1, 2, 3, 4]), 2, 0.0, rng) == [1, 3]
    picked = choose_peers(affinity, np.array([1, 2, 3, 4]), 3, 1.0, rng)
    assert len(picked) == 3 and set(picked) <= {1, 2, 3, 4}
    assert choose_peers(affinity, np.array([], dtype=np.int64), 2, 0.0, rng) == []


def test_fedfomo_sends_heard_peers_and_learns_affinity(caplog) -> None:
    fed = _federation("fedfomo", 4, **{"fomo-models": 2, "fraction-train": 1.0})
    first = fed.train_round(1)
    assert all(len(r.array_records) == 1 for r in first.values())
    assert fed.strategy.sent_peers == {pid: [] for pid in range(4)}, "nobody has been heard from in round 1"
    fed.train_round(2)
    assert all(len(peers) == 2 and pid not in peers for pid, peers in fed.strategy.sent_peers.items())
    # the affinity row of the client grows by exactly the weights it reports for the peers it was sent
    content = fed.runner.message_contents(3, [0], MessageType.TRAIN)[0]
    peers = fed.strategy.sent_peers[0]
    reply = answer(fed.client(0), MessageType.TRAIN, 3, content)
    metrics = reply.metric_records["metrics"]
    assert {"fomo-weight-0", "fomo-weight-1"} <= set(metrics)
    metrics["fomo-weight-0"], metrics["fomo-weight-1"] = 0.7, 0.3
    before = fed.strategy.affinity.copy()
    fed.runner.aggregate_train(3, [FakeReply(1000, reply)])
    delta = fed.strategy.affinity - before
    assert delta[0, peers[0]] == pytest.approx(0.7) and delta[0, peers[1]] == pytest.approx(0.3)
    assert np.count_nonzero(delta) == 2
    # a negative peer weight is rejected
    fed.strategy.train_content(3, 0, {})
    metrics["fomo-weight-0"] = -1.0
    with caplog.at_level(logging.WARNING, logger="flwr"):
        fed.runner.aggregate_train(3, [FakeReply(1000, reply)])
    assert fed.round_log.train["rejected"] == 1 and "fomo-weight-0" in caplog.text


# ----- simulated faults -----------------------------------------------------------------------------
def test_simulated_drops_are_exact_and_seeded() -> None:
    sampled = list(range(10))
    drops = choose_faulty(0, 2, sampled, 3, "drop")
    assert len(drops) == 3 and drops == choose_faulty(0, 2, sampled, 3, "drop")
    assert drops != choose_faulty(0, 3, sampled, 3, "drop") or drops != choose_faulty(0, 4, sampled, 3, "drop")
    assert choose_faulty(0, 2, sampled, 0, "drop") == set()


def test_stragglers_are_other_clients_whose_replies_are_set_aside() -> None:
    fed = _federation("fedavg", 10, **{"drop-rate": 0.2, "straggler-rate": 0.3})
    runner = fed.runner
    sampled = list(range(10))
    contents = dict(zip(sampled, runner.message_contents(1, sampled, "train")))
    dropped = {pid for pid, c in contents.items() if c.config_records["config"].get("simulate-drop")}
    late = set(fed.round_log.train["stragglers"])
    assert len(dropped) == 2 and len(late) == 3 and not dropped & late
    assert fed.round_log.train["dropped"] == sorted(dropped)
    before = [a.copy() for a in fed.strategy.global_arrays]
    replies = [FakeReply(1000 + pid, fed.client(pid).fit(1, contents[pid])) for pid in sorted(late)]
    runner.aggregate_train(1, replies)
    assert fed.round_log.train["used"] == 0 and fed.round_log.train["late"] == 3
    assert all(np.array_equal(a, b) for a, b in zip(before, fed.strategy.global_arrays)), "late replies change nothing"


def test_messages_given_up_after_the_round_timeout_are_counted_in_the_round(caplog) -> None:
    """A client that never answers: its training message is given up after round-timeout and counted as timed out
    (its reply was not received: in no other count), the summary's late replies include it, and its evaluation
    message counts as a failed one."""
    from server_app.results.log_lines import round_record
    from server_app.results.summary import summarize

    fed = _federation("fedavg", 4, **{"fraction-train": 1.0, "round-timeout": 0.3})
    silent = 1000 + 2  # partition 2's node
    pull = fed.grid.pull_messages
    fed.grid.pull_messages = lambda ids: [r for r in pull(ids) if r.metadata.src_node_id != silent]  # type: ignore
    with caplog.at_level(logging.WARNING, logger="flwr"):
        fed.train_round(1)
        fed.evaluate(1)
    train = fed.round_log.train
    assert train["timed_out"] == 1 and train["used"] == 3 and train["received"] == 3
    assert fed.round_log.eval is not None and fed.round_log.eval["failed"] == 1
    assert "1 message(s) unanswered 0.3 s after they were sent (round-timeout): given up" in caplog.text
    summary = summarize([round_record(1, 1.0, 1.0, fed.round_log, {})], {"num_clients": 4})
    assert summary["replies_late"] == [1] and summary["replies_used"] == [3]


def test_dropped_client_is_told_in_its_message() -> None:
    fed = _federation("fedavg", 10, **{"drop-rate": 0.5})
    sampled = fed.strategy.sample(1)
    contents = fed.runner.message_contents(1, sampled, "train")
    flagged = {pid for pid, c in zip(sampled, contents) if c.config_records["config"].get("simulate-drop")}
    assert flagged == choose_faulty(fed.cfg.seed, 1, sampled, len(flagged), "drop")
    assert len(flagged) == round(0.5 * len(sampled))


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5])
@pytest.mark.parametrize("algorithm", sorted(SPECS))
def test_every_algorithm_completes_with_failing_and_late_clients(algorithm: str, rate: float) -> None:
    # of the 10 clients sampled per round, 60% of `rate` fail and 40% answer after the timeout (1; 2+1; 3+2)
    fed = _federation(
        algorithm,
        10,
        **{
            "fraction-train": 1.0,
            "num-rounds": 2,
            "iterations": 1,
            "drop-rate": 0.6 * rate,
            "straggler-rate": 0.4 * rate,
        },
    )
    dropped, late = round(6 * rate), round(4 * rate)
    assert dropped + late == round(10 * rate)
    for rnd in (1, 2):
        replies = fed.train_round(rnd)
        train = fed.round_log.train
        assert train["sent"] == 10 and len(replies) == 10 - dropped and train["used"] == 10 - dropped - late
        assert train["failed"] == dropped and len(train.get("stragglers", [])) == train.get("late", 0) == late
        assert not set(train.get("stragglers", [])) & set(train["clients"]), "late replies are not used"
    fed.evaluate(2)
    result = fed.round_log.eval
    assert result["num_clients"] == 10 and np.isfinite(result["mean"]["acc-shift-0"])
    assert all(np.all(np.isfinite(a)) for a in fed.strategy.global_arrays)


def test_fedamp_with_a_constant_tau_gives_every_client_that_self_weight() -> None:
    fed = _federation("fedamp", 4, **{"fedamp-tau": 0.3, "fraction-train": 1.0})
    fed.train_round(1)
    fed.train_round(2)
    record = fed.strategy.round_record(2)
    assert record["self_weight_median"] == pytest.approx(0.7) and record["guard"] is False
    xi = fed.strategy.attention(2)
    np.testing.assert_allclose(np.diag(xi), 0.7)
    with pytest.raises(ConfigError, match="'fedamp-tau' = 1.5 must be -1 \\(off\\) or lie in \\[0, 1\\]"):
        parse_run_config({"algorithm": "fedamp", "fedamp-tau": 1.5})
