"""DM-PFL as its paper runs it: the two-phased layout, Algorithm 3's reset for every client, the learning rate decayed
per client call, whole downloads at every participation, and the base entropies on unshifted inputs."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

from client_app.algorithms.dmpfl import PERSONAL
from common.config import parse_run_config
from common.hparams import ConfigError
from common.methods.dmpfl import phase3_starts, phase_schedule, reset_personal_only
from common.wire.messages import LR_STEP, PHASE3_RESET
from common.wire.validation import PayloadError

from .inprocess import InProcessFederation
from .test_dmpfl import _federation as dmpfl_federation


def _federation(num_clients: int = 4, **overrides) -> InProcessFederation:
    return dmpfl_federation("dmpfl", num_clients, **{"num-rounds": 3, **overrides})


# ----- the schedule -----------------------------------------------------------------------------------------------
def test_halves_split_each_cycle_between_phases_1_and_2_then_one_phase_3_round() -> None:
    assert phase_schedule(6, 1, "halves") == [1, 1, 1, 2, 2, 3]
    assert phase_schedule(3, 1, "halves") == [1, 2, 3]
    paper = phase_schedule(300, 3, "halves")
    assert len(paper) == 300
    for cycle in range(3):
        rounds = paper[cycle * 100 : (cycle + 1) * 100]
        assert rounds == [1] * 50 + [2] * 49 + [3], "50 rounds of phase 1, 49 of phase 2, phase 3 between cycles"
    assert phase_schedule(300, 3) == paper, "the paper's pipeline is the default"
    assert phase_schedule(5, 0, "halves") == [1] * 5
    # too short for 3 cycles of 3 rounds: as many as fit, at least one (phase 1 always runs)
    assert phase_schedule(1, 3, "halves") == [1]
    assert phase_schedule(2, 3, "halves") == [1, 3]
    assert phase_schedule(4, 3, "halves") == [1, 1, 2, 3]
    assert phase_schedule(6, 3, "halves") == [1, 2, 3, 1, 2, 3]


def test_phase3_starts_are_the_first_round_of_each_phase_3_stretch() -> None:
    assert phase3_starts(phase_schedule(9, 1, "thirds")) == {7}
    assert phase3_starts(phase_schedule(18, 2, "thirds")) == {7, 16}
    assert phase3_starts(phase_schedule(300, 3, "halves")) == {100, 200, 300}


def test_unknown_layout_and_mode_are_config_errors() -> None:
    with pytest.raises(ValueError, match="layout"):
        phase_schedule(6, 1, "quarters")
    with pytest.raises(ConfigError, match="dmpfl-phase3"):
        parse_run_config({"algorithm": "dmpfl", "dmpfl-phase3": "some"})
    with pytest.raises(ConfigError, match="lr-decay-step"):
        parse_run_config({"lr-decay-step": "epoch"})


# ----- Algorithm 3 -------------------------------------------------------------------------------------------------
def test_reset_zeroes_exactly_the_personal_only_positions() -> None:
    w_c = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    m_g = np.array([True, True, False, False])
    m_c = np.array([True, False, True, False])
    assert reset_personal_only(w_c, m_g, m_c).tolist() == [1.0, 2.0, 0.0, 4.0]


def _personal_only(fed: InProcessFederation, pid: int) -> np.ndarray:
    weights, masks = fed.client(pid).load_sparse(PERSONAL)
    m_g = fed.strategy.global_masks
    return np.concatenate([weights[n][masks[n] & ~m_g[n]] for n in masks])


@pytest.mark.parametrize("mode", ["all", "all-reset"])
def test_phase3_for_every_client_and_the_reset_of_algorithm_3(mode: str) -> None:
    """Client 0 holds personal-only weights of 5 before phase 3, which runs at a learning rate too small to move
    anything: with the reset they are 0 after it, without it they are still 5."""
    fed = _federation(**{"dmpfl-phases": "halves", "dmpfl-phase3": mode, "lr": 1e-9})
    assert fed.strategy.phases == [1, 2, 3]
    fed.train_round(1)
    fed.train_round(2)
    m_g = fed.strategy.global_masks
    client = fed.client(0)
    w_g = fed.strategy.global_named
    masks = {n: m.copy() for n, m in m_g.items()}
    weights = {n: w.copy() for n, w in w_g.items()}
    for name, mask in masks.items():
        outside = np.flatnonzero(~mask.ravel())[:3]
        mask.ravel()[outside] = True
        weights[name].ravel()[outside] = 5.0
    client.save_sparse(PERSONAL, weights, masks)
    fed.set_state(0, client.env.state.tree)
    planted = _personal_only(fed, 0)
    assert planted.size > 0 and np.all(planted == 5.0)
    assert fed.strategy.sample(3) == [0, 1, 2, 3], "phase 3 takes every client"
    replies = fed.train_round(3)
    assert sorted(replies) == [0, 1, 2, 3]
    resets = [fed.sent[3][pid].config_records["config"].get(PHASE3_RESET, False) for pid in range(4)]
    assert resets == [mode == "all-reset"] * 4
    after = _personal_only(fed, 0)
    assert after.size == planted.size
    expected = 0.0 if mode == "all-reset" else 5.0
    assert np.abs(after - expected).max() < 1e-4


def test_reset_flag_must_be_a_bool() -> None:
    fed = _federation(**{"dmpfl-phases": "halves", "dmpfl-phase3": "all-reset"})
    fed.train_round(1)
    fed.train_round(2)
    content = fed.runner.message_contents(3, [0], "train")[0]
    content.config_records["config"][PHASE3_RESET] = 1
    with pytest.raises(PayloadError, match="phase3-reset"):
        fed.client(0).fit(3, content)


# ----- learning-rate decay per client call ------------------------------------------------------------------------
def test_lr_step_counts_the_clients_earlier_training_calls() -> None:
    fed = InProcessFederation(
        {
            "algorithm": "fedavg",
            "dataset": "digits",
            "num-rounds": 4,
            "fraction-train": 0.5,
            "local-epochs": 1,
            "lr-decay": 0.5,
            "lr-decay-step": "client",
        },
        4,
    )
    calls: dict[int, int] = {}
    for rnd in range(1, 5):
        fed.train_round(rnd)
        for pid, content in fed.sent[rnd].items():
            assert content.config_records["config"][LR_STEP] == calls.get(pid, 0)
            calls[pid] = calls.get(pid, 0) + 1
    assert fed.strategy.train_calls == calls
    assert max(calls.values()) < 4, "a hand-made schedule where clients skip rounds"
    client = fed.client(0)
    client.receive(RecordDict({"config": ConfigRecord({LR_STEP: 3})}))
    assert client.settings(server_round=40).lr == pytest.approx(fed.cfg.lr * 0.5**3), "per call, not per round"
    state = fed.strategy.state_dict()
    fed.strategy.train_calls = {}
    fed.strategy.load_state_dict(state)
    assert fed.strategy.train_calls == calls, "a resumed run goes on counting"
    evaluation = fed.runner.message_contents(5, [0], "evaluate")[0]
    assert evaluation.config_records["config"][LR_STEP] == calls.get(0, 0), "fine-tuning runs at the current rate"


def test_lr_decays_per_round_by_default_and_client_mode_needs_the_step() -> None:
    fed = _federation(**{"lr-decay": 0.5})
    client = fed.client(0)
    assert client.settings(server_round=3).lr == pytest.approx(0.1 * 0.25)
    assert LR_STEP not in fed.runner.message_contents(1, [0], "train")[0].config_records["config"]
    per_client = _federation(**{"lr-decay": 0.5, "lr-decay-step": "client"}).client(0)
    with pytest.raises(PayloadError, match="lr-step"):
        per_client.settings(server_round=3)


# ----- downloads like for like -------------------------------------------------------------------------------------
@pytest.mark.parametrize("download", ["stale", "always"])
def test_download_always_sends_what_the_client_uses_at_every_participation(download: str) -> None:
    fed = _federation(**{"num-rounds": 6, "iterations": 1, "download": download, "fraction-train": 1.0})
    for rnd in range(1, 7):  # phases 1, 1, 2, 2, 3, 3: w_g last changes in round 4, so in round 6 every client
        fed.train_round(rnd)  # holds the current version (received in round 5)
    carried = [bool(c.array_records) for c in fed.sent[6].values()]
    assert carried == [download == "always"] * 4


# ----- DM-PFL+'s base entropies ----------------------------------------------------------------------------------
def test_base_entropies_on_unshifted_test_inputs() -> None:
    fed = _federation(**{"dmpfl-base-entropy": "unshifted-test"})
    fed.train_round(1)
    pid = next(pid for pid, state in fed.states.items() if PERSONAL in state)
    client = fed.client(pid)
    content = fed.runner.message_contents(1, [pid], "evaluate")[0]
    w_g, m_g = client.refresh_global(content)
    model_c = client.to_model(client.theta_c(w_g, m_g, *client.load_sparse(PERSONAL)))
    model_g = client.to_model(client.theta_g(w_g, m_g))
    test_x, train_x = client.env.data.test_x, client.env.data.train_x
    stats_c, stats_g = client.stored_selector_stats(content, model_c, model_g)
    got = (stats_c.base_entropy, stats_g.base_entropy)
    assert got == (client.mean_entropy(model_c, test_x), client.mean_entropy(model_g, test_x))
    assert got != (client.mean_entropy(model_c, train_x), client.mean_entropy(model_g, train_x))
