"""DM-PFL and FedDST in-process: phases, what travels, mask invariants, frozen shared weights, staleness."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from client_app.algorithms.dmpfl import BASE_ENTROPY_C, BASE_ENTROPY_G, PARTIAL_CUT, PARTIAL_ID, PERSONAL
from client_app.algorithms.sparse import StaleGlobalModel
from client_app.state import ClientState
from common.learning.stages import SCOPES, stage_key
from common.methods.dmpfl import (
    AdaptiveModel,
    PersonalMaskStore,
    adaptive_predict,
    compose_personal,
    decode_partial_global,
    encode_partial_global,
    masks_digest,
)
from common.wire.records import to_record
from common.wire.validation import PayloadError
from server_app.strategies.dmpfl import DMPFLStrategy
from server_app.wire import wire_bytes

from .fakes import FakeReply
from .inprocess import InProcessFederation


def _federation(algorithm: str, num_clients: int = 4, **overrides) -> InProcessFederation:
    raw = {
        "algorithm": algorithm,
        "dataset": "digits",
        "num-rounds": 6,
        "iterations": 1,
        "fraction-train": 0.5,
        "local-epochs": 1,
        "lr": 0.1,
        "readjust-ratio": 0.2,
        "dmpfl-phases": "thirds",  # three phases of two rounds each: what these tests look at
        "dmpfl-phase3": "sampled",
        **overrides,
    }
    return InProcessFederation(raw, num_clients)


def _keys(reply: RecordDict) -> set[str]:
    return set(reply.array_records["arrays"].keys()) if "arrays" in reply.array_records else set()


def test_phases_and_what_each_uploads() -> None:
    fed = _federation("dmpfl")
    strategy: DMPFLStrategy = fed.strategy
    assert strategy.phases == [1, 1, 2, 2, 3, 3]
    versions = []
    for rnd in range(1, 7):
        replies = fed.train_round(rnd)
        versions.append(strategy.version)
        keys = set().union(*(_keys(r) for r in replies.values()))
        if rnd <= 2:
            assert any(k.endswith("/bits") for k in keys), "phase 1 uploads personal masks"
        elif rnd <= 4:
            assert keys and not any(k.endswith("/bits") for k in keys), "phase 2 uploads values on m_g only"
        else:
            assert keys == set() and len(replies) == 2, "phase 3: sampled clients, no weights"
        assert fed.round_log.train["used"] == len(replies)
    assert versions == [1, 2, 3, 4, 4, 4]


def test_phase3_all_clients_option() -> None:
    fed = _federation("dmpfl", **{"dmpfl-phase3": "all"})
    assert fed.strategy.sample(5) == [0, 1, 2, 3] and len(fed.strategy.sample(1)) == 2


def test_personal_masks_keep_their_size_and_weights_outside_stay_zero() -> None:
    fed = _federation("dmpfl", **{"num-rounds": 3, "iterations": 0})
    initial = {n: int(m.sum()) for n, m in fed.strategy.global_masks.items()}
    for rnd in (1, 2, 3):
        fed.train_round(rnd)
    trained = [pid for pid, state in fed.states.items() if PERSONAL in state]
    assert trained
    for pid in trained:
        weights, masks = fed.client(pid).load_sparse(PERSONAL)
        assert {n: int(m.sum()) for n, m in masks.items()} == initial, "prune/regrow keeps the count"
        kept = sum(a.nbytes for a in ClientState(fed.states[pid]).load_named(PERSONAL).values())
        dense = sum(weights[n].nbytes + masks[n].nbytes for n in masks)
        assert kept < 0.6 * dense, "w_c and m_c are kept as bits + values, not dense weights and bool masks"
        for name, mask in masks.items():
            assert not np.any(weights[name][~mask]), "a weight outside m_c is zero"


def test_global_mask_sparser_or_equal_to_target_after_vote() -> None:
    fed = _federation("dmpfl", **{"num-rounds": 2, "iterations": 0})
    fed.train_round(1)
    for name, mask in fed.strategy.global_masks.items():
        assert mask.sum() <= round(fed.strategy.densities[name] * mask.size)


def test_phase3_leaves_shared_weights_bit_identical() -> None:
    fed = _federation("dmpfl")
    for rnd in range(1, 5):
        fed.train_round(rnd)
    strategy = fed.strategy
    w_g, m_g = strategy.global_named, strategy.global_masks
    before = {}
    for pid in strategy.clients:
        client = fed.client(pid)
        content = strategy.eval_content(5, pid, strategy.shared_payload(5))  # the whole theta_g
        g, gm = client.refresh_global(content)
        before[pid] = client.theta_c(g, gm, *client.personal(g, gm)), client.personal(g, gm)[1]
    sampled = fed.train_round(5)
    assert sampled
    for pid in sampled:
        theta_before, m_c = before[pid]
        client = fed.client(pid)
        w_c = client.load_sparse(PERSONAL)[0]
        theta_after = client.theta_c(w_g, m_g, w_c, m_c)
        for name in client.names:
            if name in m_g:
                shared = m_c[name] & m_g[name]
                assert np.array_equal(theta_after[name][shared], w_g[name][shared])
                own = m_c[name] & ~m_g[name]
                assert np.array_equal(theta_after[name][~own], theta_before[name][~own])
            else:
                assert np.array_equal(theta_after[name], w_g[name]), "dense layers are shared and frozen"
        changed = any(not np.array_equal(theta_after[n], theta_before[n]) for n in m_g)
        assert changed or all(not (m_c[n] & ~m_g[n]).any() for n in m_g)


def test_global_model_sent_only_when_stale_and_resent_after_a_failure() -> None:
    fed = _federation("dmpfl")
    fed.train_round(1)
    fed.evaluate(1)  # evaluation delivers the current version to every client
    strategy = fed.strategy
    holder = next(pid for pid, v in strategy.delivered.items() if v == strategy.version)
    content = strategy.train_content(2, holder, strategy.shared_payload(2))
    assert "global" not in content.array_records, "a client holding the current version gets no model"
    fed.set_state(holder, {})  # the device lost its state
    with pytest.raises(StaleGlobalModel):
        fed.client(holder).fit(2, content)
    fed.runner.aggregate_train(2, [FakeReply(1000 + holder, error="StaleGlobalModel")])
    assert "global" in strategy.train_content(2, holder, strategy.shared_payload(2)).array_records


def _run_counting_down_bytes(fed: InProcessFederation, rounds: int) -> list[int]:
    """Train `rounds` rounds; the training-download bytes of each round."""
    sent: list[int] = []
    contents = fed.runner.message_contents

    def counted(rnd, pids, kind, newcomers=False):
        out = contents(rnd, pids, kind, newcomers)
        sent[-1] += sum(wire_bytes(c) for c in out)
        return out

    fed.runner.message_contents = counted
    for rnd in range(1, rounds + 1):
        sent.append(0)
        fed.train_round(rnd)
    fed.runner.message_contents = contents
    return sent


def test_partial_downloads_change_nothing_but_the_bytes() -> None:
    """Phases 1 and 3 sent only w_g on m_g AND m_c: every client's state and evaluation are bit-identical to
    whole-model downloads, and the downloads are smaller (9 rounds, two cycles)."""
    runs = {}
    for partial in (True, False):
        fed = _federation(
            "dmpfl", 4, **{"num-rounds": 9, "iterations": 2, "partial-download": partial, "fraction-train": 0.75}
        )
        runs[partial] = fed, _run_counting_down_bytes(fed, 9), fed.evaluate(9)
    (fed_p, bytes_p, eval_p), (fed_f, bytes_f, eval_f) = runs[True], runs[False]
    for pid in range(4):
        for key in (PERSONAL,):
            got, want = ClientState(fed_p.states[pid]).load_named(key), ClientState(fed_f.states[pid]).load_named(key)
            assert (got is None) == (want is None)
            for name in got or {}:
                np.testing.assert_array_equal(got[name], want[name])
        assert dict(eval_p[pid].metric_records["metrics"]) == dict(eval_f[pid].metric_records["metrics"])
    phases = fed_p.strategy.phases
    assert set(phases) == {1, 2, 3} and phases[0] == 1
    assert bytes_p[0] == bytes_f[0], "round 1: no m_c known yet, whole models"
    assert all(bytes_p[r - 1] == bytes_f[r - 1] for r in range(1, 10) if phases[r - 1] == 2)
    assert all(bp <= bf for bp, bf in zip(bytes_p, bytes_f)), "a cut is sent once per version, like the model"
    assert sum(bytes_p) < 0.97 * sum(bytes_f)


def test_partial_download_roundtrip_on_hand_made_masks() -> None:
    w_g = {"w": np.arange(12, dtype=np.float32).reshape(3, 4) + 1, "b": np.array([7.0, 8.0], np.float32)}
    m_g = {"w": np.array([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]], bool)}
    m_c = {"w": np.array([[1, 0, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]], bool)}
    arrays = encode_partial_global(w_g, m_g, m_c)
    assert arrays["w/values"].tolist() == [1.0, 5.0, 7.0]  # w_g on m_g AND m_c, row-major
    assert arrays["w/bits"].size == 1, "bits over m_c's 5 positions: one byte, not two for 12"
    weights, masks = decode_partial_global(arrays, {"w": (3, 4), "b": (2,)}, m_c)
    np.testing.assert_array_equal(masks["w"], m_g["w"] & m_c["w"])
    np.testing.assert_array_equal(weights["w"], np.where(m_g["w"] & m_c["w"], w_g["w"], 0.0))
    np.testing.assert_array_equal(weights["b"], w_g["b"])
    w_c = {"w": np.full((3, 4), -1.0, np.float32)}
    np.testing.assert_array_equal(
        compose_personal(weights["w"], masks["w"], w_c["w"], m_c["w"]),
        compose_personal(w_g["w"], m_g["w"], w_c["w"], m_c["w"]),
    )
    other = {"w": np.roll(m_c["w"], 1)}
    assert masks_digest(other) != masks_digest(m_c)
    with pytest.raises(PayloadError):  # cut for 5 positions, decoded for another count
        decode_partial_global(arrays, {"w": (3, 4), "b": (2,)}, {"w": np.ones((3, 4), bool)})


@pytest.mark.parametrize("on_disk", [False, True])
def test_personal_mask_store_keeps_packed_rows(tmp_path, on_disk: bool) -> None:
    rng = np.random.default_rng(0)
    shapes = {"a": (3, 5), "b": (17,)}
    path = tmp_path / "masks.npy" if on_disk else None
    store = PersonalMaskStore([4, 9, 2], shapes, path)
    assert store.get(9) is None and store.bits is None, "nothing is allocated before the first put"
    masks = {name: rng.random(shape) < 0.5 for name, shape in shapes.items()}
    store.put(9, masks)
    store.put(7, masks)  # no row: not kept
    assert store.width == 2 + 3 and store.bits is not None and store.bits.shape == (3, 5)
    got = store.get(9)
    assert got is not None and all(np.array_equal(got[n], masks[n]) for n in shapes)
    assert store.get(4) is None and store.get(7) is None
    store.forget(9)
    assert store.get(9) is None
    assert isinstance(store.bits, np.memmap) == on_disk
    store.close()
    assert not (tmp_path / "masks.npy").exists()


def test_personal_mask_store_state_restores_known_rows_by_partition(tmp_path) -> None:
    rng = np.random.default_rng(1)
    shapes = {"a": (3, 5), "b": (17,)}
    masks = {pid: {name: rng.random(shape) < 0.5 for name, shape in shapes.items()} for pid in (4, 9, 2)}
    store = PersonalMaskStore([4, 9, 2], shapes, tmp_path / "masks.npy")
    assert store.state()["bits"].shape == (0, 5), "an empty store saves no rows"
    for pid in (4, 2):
        store.put(pid, masks[pid])
    state = store.state()
    resumed = PersonalMaskStore([2, 9, 4, 11], shapes)  # other row order, a client the checkpoint lacks
    resumed.restore(state)
    for pid in (4, 2):
        got = resumed.get(pid)
        assert got is not None and all(np.array_equal(got[n], masks[pid][n]) for n in shapes)
    assert resumed.get(9) is None and resumed.get(11) is None
    resumed.restore(PersonalMaskStore([4], shapes).state())  # nothing known: nothing changes
    assert resumed.get(4) is not None
    with pytest.raises(ValueError, match="personal masks"):
        PersonalMaskStore([4, 9, 2], {"a": (3, 5)}).restore(state)
    with pytest.raises(ValueError, match="personal masks"):
        resumed.restore({**state, "known": state["known"].astype(np.uint8)})


def test_a_resumed_dmpfl_server_without_masks_in_its_checkpoint_sends_whole_models(tmp_path) -> None:
    fed = _federation("dmpfl")
    fed.train_round(1)
    state = fed.strategy.state_dict()
    old = {k: v for k, v in state.items() if k not in ("personal-masks", "delivered-partial")}  # an older checkpoint
    resumed = _federation("dmpfl")
    resumed.strategy.load_state_dict(old)
    pid = next(p for p in fed.strategy.clients.ids() if fed.strategy.personal_masks.get(p) is not None)
    assert resumed.strategy.personal_masks.get(pid) is None
    resumed.strategy.load_state_dict(state)
    restored, kept = resumed.strategy.personal_masks.get(pid), fed.strategy.personal_masks.get(pid)
    assert restored is not None and kept is not None and all(np.array_equal(restored[n], kept[n]) for n in kept)


def _phase3_cut() -> tuple[InProcessFederation, int, RecordDict]:
    """After 4 rounds (phases 1, 1, 2, 2): a client whose m_c the server knows and its round-5 message (a cut)."""
    fed = _federation("dmpfl")
    for rnd in range(1, 5):
        fed.train_round(rnd)
    strategy = fed.strategy
    pid = next(p for p in strategy.clients.ids() if strategy.personal_masks.get(p) is not None)
    content = strategy.train_content(5, pid, strategy.shared_payload(5))
    assert "global-partial" in content.array_records and "global" not in content.array_records
    assert strategy.phase(5) == 3
    return fed, pid, content


def test_a_partial_download_for_another_mask_is_stale_and_then_sent_whole() -> None:
    fed, pid, content = _phase3_cut()
    strategy = fed.strategy
    fed.set_state(pid, {})  # the device lost its m_c
    with pytest.raises(StaleGlobalModel, match="personal mask"):
        fed.client(pid).fit(5, content)
    fed.runner.aggregate_train(5, [FakeReply(1000 + pid, error="StaleGlobalModel")])
    again = strategy.train_content(5, pid, strategy.shared_payload(5))
    assert "global" in again.array_records and "global-partial" not in again.array_records
    phase2 = RecordDict(
        {
            "config": ConfigRecord({**dict(content.config_records["config"]), "phase": 2}),
            "global-partial": content.array_records["global-partial"],
        }
    )
    with pytest.raises(PayloadError, match="phase 2"):
        fed.client(pid).fit(3, phase2)


def test_stages_of_the_sparse_algorithms() -> None:
    for algorithm, stages in (("dmpfl", ("G", "L1", "L2", "L1+", "L2+")), ("feddst", ("G", "L1", "L2"))):
        fed = _federation(algorithm, **{"stages": True, "num-rounds": 6})
        for rnd in range(1, 7):
            replies = fed.train_round(rnd)
            keys = set().union(*(set(r.metric_records["metrics"]) for r in replies.values()))
            want = set(stages) - ({"L2+"} if algorithm == "dmpfl" and fed.strategy.phase(rnd) == 2 else set())
            assert {stage_key(st, sc) for st in want for sc in SCOPES} <= keys, (algorithm, rnd)
            content = fed.strategy.train_content(rnd, 0, fed.strategy.shared_payload(rnd))
            assert "global-partial" not in content.array_records, "stages evaluate the whole theta_g"
        assert set(fed.round_log.train["stages"]) == set(stages) - (
            {"L2+"} if algorithm == "dmpfl" and fed.strategy.phase(6) == 2 else set()
        )


def test_adaptive_model_predicts_what_alg4_picks() -> None:
    torch.manual_seed(0)
    personal, shared = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    x = torch.randn(40, 5)
    predictions, used = adaptive_predict(personal(x), shared(x), 0.4, 0.9)
    with torch.no_grad():
        assert torch.equal(AdaptiveModel(personal, shared, 0.4, 0.9)(x).argmax(1), predictions)
    assert 0 < int(used.sum()) < 40, "both models chosen somewhere (else the test proves little)"


def test_evaluation_reports_dmpfl_plus_and_global() -> None:
    fed = _federation("dmpfl")
    for rnd in range(1, 7):
        fed.train_round(rnd)
    replies = fed.evaluate(6)
    metrics = next(iter(replies.values())).metric_records["metrics"]
    for prefix in ("", "plus-", "global-"):
        assert 0.0 <= metrics[f"{prefix}acc-shift-1"] <= 1.0
    ev = fed.round_log.eval
    assert ev["num_clients"] == 4 and "plus-acc-shift-0" in ev["mean"] and "global-acc-shift-1" in ev["mean"]


def _count_forwards(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every batch a model of the project runs forward (every torch.nn.Sequential call at top level)."""
    calls = [0]
    original = torch.nn.Module.__call__

    def counting(module: torch.nn.Module, *args, **kwargs):  # type: ignore[no-untyped-def]
        if type(module).__module__.startswith("common.learning.models"):
            calls[0] += 1
        return original(module, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "__call__", counting)
    return calls


def test_dmpfl_evaluation_runs_each_model_once_per_set_with_identical_metrics(monkeypatch) -> None:
    import client_app.algorithms.dmpfl as client_dmpfl

    results = {}
    for memo in (True, False):
        with monkeypatch.context() as patch:
            if not memo:
                patch.setattr(client_dmpfl, "MemoLogits", lambda model: model)
            # one forward call per set: calls count passes
            patch.setattr("common.learning.evaluate.CPU_IMAGE_BATCH", 10**6)
            fed = _federation("dmpfl", num_clients=6, **{"shift-degrees": "0,0.5,1", "fraction-train": 0.34})
            for rnd in range(1, 7):
                fed.train_round(rnd)
            calls = _count_forwards(patch)
            replies = fed.evaluate(6)
            results[memo] = calls[0], {cid: dict(r.metric_records["metrics"]) for cid, r in replies.items()}
    (with_memo, metrics), (without, reference) = results[True], results[False]
    assert metrics == reference, "the memo changes no metric"
    # with the memo, one pass per model and set: theta_c and theta_g on the test set and shift draws (one set: 2),
    # theta_g on the training data for BE_g (1) and theta_c there for BE_c unless its phase 3 stored it (1); a
    # client that never trained holds theta_c = theta_g, one model on the test set and draws (1): DM-PFL+ would
    # choose between two identical models, so no base entropy is computed, and its three rows are the same numbers
    kinds = [
        (
            ClientState(fed.states[pid]).load_named(PERSONAL) is not None,
            ClientState(fed.states[pid]).load_named(BASE_ENTROPY_C) is not None,
        )
        for pid in sorted(fed.states)
    ]
    assert {(False, False), (True, False), (True, True)} <= set(kinds), kinds
    assert with_memo == sum(1 if not trained else 4 - stored_c for trained, stored_c in kinds), (with_memo, kinds)
    assert without > with_memo
    for pid, (trained, _) in zip(sorted(fed.states), kinds):
        if not trained:
            assert ClientState(fed.states[pid]).load_named(BASE_ENTROPY_G) is None
            row = metrics[pid]
            keys = [f"acc-shift-{d:g}" for d in (0, 0.5, 1)]
            assert all(row[p + key] == row[key] for p in ("plus-", "global-") for key in keys), row


def test_memo_logits_runs_a_batch_once_and_tells_inputs_apart() -> None:
    from common.learning.evaluate import MemoLogits, predict_logits

    calls = []
    model = torch.nn.Linear(4, 3)
    model.register_forward_hook(lambda module, inputs, output: calls.append(len(inputs[0])))
    memo = MemoLogits(model)
    x, other = torch.randn(10, 4), torch.randn(10, 4)
    first = predict_logits(memo, x, batch_size=4)
    assert calls == [4, 4, 2]
    assert torch.equal(predict_logits(memo, x, batch_size=4), first) and calls == [4, 4, 2]
    assert torch.equal(predict_logits(memo, other, batch_size=4), predict_logits(model, other, batch_size=4))
    assert calls == [4, 4, 2, 4, 4, 2, 4, 4, 2]
    assert torch.equal(first, predict_logits(model, x, batch_size=4))


def test_sparse_upload_is_smaller_than_dense() -> None:
    fed = _federation("dmpfl", **{"sparsity": 0.8})
    reply = next(iter(fed.train_round(1).values()))
    sparse = wire_bytes(RecordDict({"arrays": reply.array_records["arrays"]}))
    dense_arrays = [a for a in fed.strategy.global_arrays]
    dense = wire_bytes(RecordDict({"arrays": to_record([n for n, _ in fed.strategy.specs], dense_arrays)}))
    assert sparse < 0.5 * dense


def test_feddst_readjusts_only_on_schedule() -> None:
    fed = _federation("feddst", **{"readjust-interval": 2, "dst-readjust-ratio": 0.2})
    counts = {n: int(m.sum()) for n, m in fed.strategy.global_masks.items()}
    r1 = fed.train_round(1)
    assert not any(k.endswith("/bits") for r in r1.values() for k in _keys(r))
    r2 = fed.train_round(2)
    assert all(any(k.endswith("/bits") for k in _keys(r)) for r in r2.values())
    assert {n: int(m.sum()) for n, m in fed.strategy.global_masks.items()} == counts
    assert fed.strategy.version == 2


def test_bad_sparse_upload_is_rejected(caplog) -> None:
    fed = _federation("dmpfl")
    strategy = fed.strategy
    bad = RecordDict(
        {
            "arrays": to_record(["x/dense"], [np.zeros(3, np.float32)]),
            "metrics": MetricRecord({"num-examples": 5, "train-loss": 0.1}),
        }
    )
    with caplog.at_level("WARNING"):
        fed.runner.aggregate_train(1, [FakeReply(1000, bad)])
    assert fed.round_log.train["rejected"] == 1
    assert "client 0: training reply rejected: tensor names differ from the model's" in caplog.text
    assert strategy.version == 0, "nothing was aggregated"


def test_denser_mask_than_allowed_is_rejected(caplog) -> None:
    from common.wire.codec import encode_model
    from common.wire.records import to_plain_record

    fed = _federation("dmpfl")
    strategy = fed.strategy
    dense_masks = {n: np.ones(strategy.shapes[n], bool) for n in strategy.prunable}
    upload = to_plain_record(encode_model(strategy.global_named, dense_masks))
    bad = RecordDict({"arrays": upload, "metrics": MetricRecord({"num-examples": 5, "train-loss": 0.1})})
    with caplog.at_level("WARNING"):
        fed.runner.aggregate_train(1, [FakeReply(1000, bad)])
    assert fed.round_log.train["rejected"] == 1 and "than the" in caplog.text and "its density allows" in caplog.text


def test_a_client_holding_the_whole_model_keeps_no_cut_of_it_and_trains_as_with_the_cut() -> None:
    """An evaluation leaves the whole global model in client state: the cut of that version is dropped (it would be
    a third of the state at 10,000 clients), and a phase-3 message that names the cut without sending it is served
    from the whole model, exactly as from the cut."""
    fed, pid, content = _phase3_cut()
    strategy = fed.strategy
    strategy.delivered.pop(pid, None)
    evaluation = strategy.eval_content(5, pid, strategy.shared_payload(5))
    assert "global" in evaluation.array_records
    holder = fed.client(pid)
    holder.fit(5, content)  # holds the cut of this version now
    assert holder.env.state.has(PARTIAL_CUT)
    holder.evaluate(5, evaluation)
    assert not holder.env.state.has(PARTIAL_CUT) and not holder.env.state.has(PARTIAL_ID)

    with_cut = fed.client(pid)
    trained_with_cut = with_cut.fit(5, content)
    from_whole = fed.client(pid)
    from_whole.evaluate(5, evaluation)
    bare = RecordDict({"config": content.config_records["config"]})  # the server believes the cut delivered
    trained_from_whole = from_whole.fit(5, bare)
    assert dict(trained_from_whole.metric_records["metrics"]) == dict(trained_with_cut.metric_records["metrics"])
    got, want = from_whole.env.state.load_named(PERSONAL), with_cut.env.state.load_named(PERSONAL)
    assert got is not None and want is not None and got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    with pytest.raises(StaleGlobalModel, match="no cut"):
        fed.client(pid).fit(5, bare)  # holds neither the cut nor this version whole


@pytest.mark.parametrize(
    ("overrides", "same_as"),
    [
        ({}, None),
        ({"dmpfl-select-calibration": "temperature"}, "selector-calibrated-"),
        ({"dmpfl-select-similarity": "logits"}, "selector-logits-"),
    ],
)
def test_every_evaluation_reports_each_selector_and_where_the_two_models_disagree(overrides: dict, same_as) -> None:
    """DM-PFL+ as configured, its two other readings and the disagreement shares, per client and shift degree:
    where theta_c and theta_g agree they are equally right, so acc(theta_c) - acc(theta_g) is exactly the share of
    disagreements theta_c gets right minus the share theta_g gets right; the configured row is the variant it names."""
    fed = _federation("dmpfl", **{"shift-degrees": "0,0.5,1"}, **overrides)
    for rnd in range(1, 7):
        fed.train_round(rnd)
    replies = fed.evaluate(6)
    trained = 0
    for reply in replies.values():
        m = dict(reply.metric_records["metrics"])
        for d in ("0", "0.5", "1"):
            key = f"acc-shift-{d}"
            share = {p: m[f"disagree-{p}{key}"] for p in ("", "to-c-", "c-right-", "g-right-")}
            assert share["to-c-"] <= share[""] and share["c-right-"] + share["g-right-"] <= share[""] + 1e-9
            assert m[key] - m["global-" + key] == pytest.approx(share["c-right-"] - share["g-right-"], abs=1e-9)
            for prefix in ("selector-logits-", "selector-calibrated-"):
                assert 0.0 <= m[prefix + key] <= 1.0
            if same_as:
                assert m["plus-" + key] == m[same_as + key]
        trained += m["disagree-acc-shift-0"] > 0
    assert trained, "somewhere the two models disagree"
    ev = fed.round_log.eval
    assert "selector-calibrated-acc-shift-1" in ev["mean"] and "disagree-to-c-acc-shift-0" in ev["mean"]
