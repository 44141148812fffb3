"""DM-PFL math on hand-made tensors: schedule, Eq. 4, Eq. 5 (incl. positions outside the union), vote filter, Alg. 4."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.methods.dmpfl import (
    adaptive_predict,
    aggregate_masked,
    aggregate_round,
    compose_global,
    compose_personal,
    phase_schedule,
    select_global_mask,
)


def test_phase_schedule_equal_thirds_per_cycle() -> None:
    assert phase_schedule(9, 1, "thirds") == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert phase_schedule(18, 3, "thirds") == [1, 1, 2, 2, 3, 3] * 3
    assert phase_schedule(4, 0, "thirds") == [1, 1, 1, 1]
    paper = phase_schedule(300, 3, "thirds")  # T = 300: each phase gets 99..102 rounds (300 / 9 is not whole)
    assert len(paper) == 300 and all(99 <= paper.count(p) <= 102 for p in (1, 2, 3))


def test_eq4_composition() -> None:
    w_g = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    w_c = np.array([10.0, 20.0, 30.0, 40.0], np.float32)
    m_g = np.array([True, True, False, False])
    m_c = np.array([True, False, True, False])
    assert compose_personal(w_g, m_g, w_c, m_c).tolist() == [1.0, 0.0, 30.0, 0.0]
    assert compose_global(w_g, m_g).tolist() == [1.0, 2.0, 0.0, 0.0]


def test_eq5_weighted_on_union_old_value_elsewhere() -> None:
    w_g = np.array([9.0, 9.0, 9.0, 9.0], np.float32)
    w1, m1 = np.array([1.0, 2.0, 5.0, 7.0], np.float32), np.array([True, True, False, False])
    w2, m2 = np.array([3.0, 6.0, 8.0, 7.0], np.float32), np.array([True, False, True, False])
    new, votes = aggregate_masked(w_g, [w1[m1], w2[m2]], [m1, m2], [1, 3])  # the values on each mask, as uploaded
    # pos 0: (1*1 + 3*3)/(1+3) = 2.5; pos 1: only client 1 -> 2; pos 2: only client 2 -> 8; pos 3: nobody -> old 9
    assert new.tolist() == [2.5, 2.0, 8.0, 9.0]
    assert votes.tolist() == [2, 1, 1, 0]
    with pytest.raises(ValueError, match="values"):  # a dense upload is not its values
        aggregate_masked(w_g, [w1, w2], [m1, m2], [1, 3])


def test_vote_filter_at_exactly_30_percent() -> None:
    w_g = np.array([5.0, 4.0, 3.0, 2.0, 1.0], np.float32)
    votes = np.array([3, 4, 10, 0, 4])  # 10 clients received: 3 votes is exactly 30%, not above
    mask = select_global_mask(w_g, votes, num_received=10, density=0.6, min_vote_fraction=0.3)
    assert mask.tolist() == [False, True, True, False, True]
    sparser = select_global_mask(w_g, np.array([10, 0, 0, 0, 0]), 10, density=0.6, min_vote_fraction=0.3)
    assert sparser.tolist() == [True, False, False, False, False], "failing the vote is never selected"


def test_aggregate_round_dense_layers_weighted_mean() -> None:
    w_g = {"w": np.zeros(4, np.float32), "b": np.zeros(2, np.float32)}
    replies = [
        (
            {"w": np.array([1, 1], np.float32), "b": np.array([1, 2], np.float32)},
            {"w": np.array([True, True, False, False])},
            1.0,
        ),
        (
            {"w": np.array([3, 3], np.float32), "b": np.array([3, 4], np.float32)},
            {"w": np.array([False, True, True, False])},
            1.0,
        ),
    ]
    new_w, new_m = aggregate_round(w_g, replies, {"w": 0.5}, min_vote_fraction=0.3)
    assert new_w["w"].tolist() == [1.0, 2.0, 3.0, 0.0]
    assert new_w["b"].tolist() == [2.0, 3.0]
    assert new_m["w"].tolist() == [False, True, True, False]
    assert set(new_m) == {"w"}


def test_adaptive_inference_follows_the_rule() -> None:
    confident_c = torch.tensor([[8.0, 0.0, 0.0]])  # personal: low entropy, predicts class 0
    unsure_g = torch.tensor([[0.0, 0.3, 0.0]])  # global: high entropy, predicts class 1
    pred, used = adaptive_predict(confident_c, unsure_g, base_entropy_c=0.1, base_entropy_g=0.1)
    assert used.tolist() == [True] and pred.tolist() == [0]
    # the same outputs, but the models disagree (Sim ~ 0.51) and theta_g's base entropy is high: choose theta_g
    pred, used = adaptive_predict(confident_c, unsure_g, base_entropy_c=0.0, base_entropy_g=50.0)
    assert used.tolist() == [False] and pred.tolist() == [1]
    # identical outputs and base entropies: equal scores choose theta_g (the rule's strict <)
    same = torch.tensor([[1.0, 2.0, 0.5]])
    _, used = adaptive_predict(same, same.clone(), 0.0, 0.0)
    assert used.tolist() == [False]


def _paper_rule(logits_c: torch.Tensor, logits_g: torch.Tensor, be_c: float, be_g: float) -> torch.Tensor:
    """Alg. 4 as this project implemented it before calibration existed, written out: softmax entropies and the
    cosine similarity of the softmax outputs, strict <."""
    p_c, p_g = torch.softmax(logits_c, dim=1), torch.softmax(logits_g, dim=1)
    cos = torch.nn.functional.cosine_similarity(p_c, p_g, dim=1)
    e_c = -(p_c * p_c.clamp_min(1e-12).log()).sum(1)
    e_g = -(p_g * p_g.clamp_min(1e-12).log()).sum(1)
    return (e_c - (1 - cos) * be_c) < (e_g - (1 - cos) * be_g)


def test_fitting_a_temperature_lowers_an_over_confident_models_nll_and_finds_a_known_one() -> None:
    from common.methods.dmpfl import fit_temperature

    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(4000, 10, generator=generator)
    labels = torch.distributions.Categorical(logits=scores).sample()  # softmax(scores) is calibrated
    over = 4.0 * scores  # the same ranking, four times too confident
    t = fit_temperature(over, labels)
    nll = torch.nn.functional.cross_entropy
    assert t == pytest.approx(4.0, rel=0.1)
    assert nll(over / t, labels) < nll(over, labels) - 0.5
    assert fit_temperature(scores / 3.0, labels) == pytest.approx(1 / 3.0, rel=0.1), "an under-confident one too"
    assert fit_temperature(torch.empty(0, 10), torch.empty(0, dtype=torch.long)) == 1.0


def test_the_selector_at_temperature_one_is_todays_output_bit_for_bit() -> None:
    from common.methods.dmpfl import AdaptiveModel, SelectorStats, make_selector

    generator = torch.Generator().manual_seed(3)
    personal, shared = torch.nn.Linear(6, 5), torch.nn.Linear(6, 5)
    with torch.no_grad():
        personal.weight.mul_(4.0)
    x = torch.randn(500, 6, generator=generator)
    be_c, be_g = 0.37, 0.81
    today = torch.where(_paper_rule(personal(x), shared(x), be_c, be_g)[:, None], personal(x), shared(x))
    paper = AdaptiveModel(personal, shared, be_c, be_g)(x)
    stats_c, stats_g = SelectorStats(9.0, 1.0, be_c), SelectorStats(9.0, 1.0, be_g)  # temperature 1
    unit = make_selector(personal, shared, stats_c, stats_g, calibrated=True)
    assert torch.equal(paper, today) and torch.equal(unit(x), today)
    choices = _paper_rule(personal(x), shared(x), be_c, be_g)
    assert 0 < int(choices.sum()) < len(x), "the rule picks each model somewhere"
    # temperatures move the choice (never a prediction of either model): theta_c calmed 10x is picked less
    calm = make_selector(personal, shared, SelectorStats(0, 10.0, be_c), SelectorStats(0, 1.0, be_g), calibrated=True)
    assert calm.chooses_personal(personal(x), shared(x)).sum() < choices.sum()
    logits = AdaptiveModel(personal, shared, be_c, be_g, "logits")
    assert not torch.equal(logits.chooses_personal(personal(x), shared(x)), choices), "the logits reading differs"


def test_disagreements_count_on_hand_made_predictions() -> None:
    from common.methods.dmpfl import disagreements

    logits_c = torch.tensor([[5.0, 0, 0], [5.0, 0, 0], [0, 5.0, 0], [0, 0, 5.0]])  # predicts 0, 0, 1, 2
    logits_g = torch.tensor([[5.0, 0, 0], [0, 5.0, 0], [0, 0, 5.0], [0, 5.0, 0]])  # predicts 0, 1, 2, 1
    used = torch.tensor([True, True, False, False])
    labels = torch.tensor([0, 0, 2, 1])
    got = disagreements(logits_c, logits_g, used, labels)
    assert got["disagree"].tolist() == [False, True, True, True]
    assert got["to-c"].tolist() == [False, True, False, False]
    assert got["c-right"].tolist() == [False, True, False, False]
    assert got["g-right"].tolist() == [False, False, True, True]
