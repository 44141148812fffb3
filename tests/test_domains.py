"""The four-domain Digits data set built offline, its `domains` partition and the per-domain evaluation rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.data.arrays import DataError
from common.data.domains import DOMAINS, domain_partition, grey32, mnist_m, render_digits


def test_mnist_m_blend_inverts_the_background_where_the_digit_is() -> None:
    digits = np.zeros((1, 3, 2, 2), np.uint8)
    digits[0, :, 0, 0] = 255
    background = np.full((1, 3, 2, 2), 40, np.uint8)
    background[0, 0] = 200
    out = mnist_m(digits, background)
    assert out.dtype == np.uint8
    assert out[0, :, 0, 0].tolist() == [55, 215, 215] and out[0, :, 1, 1].tolist() == [200, 40, 40]


def test_rendered_digits_are_seeded_rgb_32x32() -> None:
    labels = np.arange(10)
    first = render_digits(labels, np.random.default_rng(3))
    assert first.shape == (10, 3, 32, 32) and first.dtype == np.uint8
    np.testing.assert_array_equal(first, render_digits(labels, np.random.default_rng(3)))
    assert not np.array_equal(first, render_digits(labels, np.random.default_rng(4)))
    assert all(first[i].std() > 10 for i in range(10)), "every image shows a digit on its background"


def test_grey_digits_are_resized_to_32x32_not_padded() -> None:
    # MNIST (28x28) and USPS (16x16) both fill the 32x32 frame, as the Digits loader the paper ran on does
    for size in (28, 16):
        frame = np.zeros((1, size, size), dtype=np.uint8)
        frame[0, 0, :] = frame[0, -1, :] = frame[0, :, 0] = frame[0, :, -1] = 255  # a one-pixel border
        out = grey32(frame)
        assert out.shape == (1, 3, 32, 32) and out.dtype == np.uint8
        assert out[0, 0, 0, 0] == 255 and out[0, 0, 31, 31] == 255, "the border reaches the corners"
        assert out[0, 0, 16, 16] == 0
    np.testing.assert_array_equal(grey32(np.full((2, 28, 28), 200, np.uint8)), np.full((2, 3, 32, 32), 200))


def test_the_domains_partition_covers_every_domain_and_keeps_clients_disjoint() -> None:
    domain = np.repeat(np.arange(4), [1000, 300, 1000, 1000])
    clients, assigned, held_out = domain_partition(domain, 10, share=0.05, test_size=100, seed=7)
    assert sorted(set(assigned)) == [0, 1, 2, 3]
    every = np.concatenate(clients + held_out)
    assert len(every) == len(np.unique(every)), "no sample twice"
    for client, d in zip(clients, assigned, strict=True):
        assert set(domain[client]) == {d} and len(client) == (15 if d == 1 else 50)
    assert [len(h) for h in held_out] == [100] * 4 and all(set(domain[h]) == {d} for d, h in enumerate(held_out))
    again = domain_partition(domain, 10, share=0.05, test_size=100, seed=7)
    assert again[1] == assigned and all(np.array_equal(a, b) for a, b in zip(again[0], clients))
    assert domain_partition(domain, 10, share=0.05, test_size=100, seed=8)[1] != assigned
    with pytest.raises(DataError, match="at least 4 clients"):
        domain_partition(domain, 3, 0.05, 100, seed=0)
    with pytest.raises(DataError, match="lower domain-share or domain-test-size"):
        domain_partition(domain, 10, 0.5, 100, seed=0)


def test_the_built_domains_have_the_documented_shape_and_range(data_dir, tmp_path, monkeypatch) -> None:
    from common.data.datasets import load_dataset

    data = load_dataset("digit-domains", str(data_dir))
    assert data.x.shape[1:] == (3, 32, 32) and data.x.dtype == np.uint8 and data.y.dtype == np.int64
    assert data.domain_names == DOMAINS
    assert np.bincount(data.domain).tolist() == [20_000, 9_298, 20_000, 20_000]
    assert set(np.unique(data.y)) == set(range(10))
    grey = data.x[data.domain == 0]
    assert np.array_equal(grey[:, 0], grey[:, 2]), "MNIST grey"
    coloured = data.x[data.domain == 2]
    assert not np.array_equal(coloured[:, 0], coloured[:, 2]), "MNIST-M over colour photos"


def test_a_client_reports_the_global_model_on_its_domain(data_dir) -> None:
    from server_app.replies import domain_key

    from .inprocess import InProcessFederation

    raw = {
        "algorithm": "fedavg",
        "dataset": "digit-domains",
        "partition": "domains",
        "data-dir": str(data_dir),
        "num-rounds": 1,
        "fraction-train": 1.0,
        "local-epochs": 1,
        "model": "resnet10-s",
        "domain-share": 0.002,
        "domain-test-size": 50,
        "shift-degrees": "0",
    }
    fed = InProcessFederation(raw, 4)
    assert sorted(fed.data[pid].domain for pid in range(4)) == [0, 1, 2, 3]
    fed.evaluate(0)
    means = fed.round_log.eval["mean"]
    assert {domain_key(name) for name in DOMAINS} <= set(means)
    assert all(0.0 <= means[domain_key(name)] <= 1.0 for name in DOMAINS)


class _FirstPixel(torch.nn.Module):
    """Predicts the class written in each image's first pixel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(x[:, 0, 0, 0].long() % 10, 10).float()


def _images(labels: torch.Tensor, offset: int) -> torch.Tensor:
    x = torch.zeros(len(labels), 3, 4, 4)
    x[:, 0, 0, 0] = ((labels + offset) % 10).float()
    return x


def test_domain_summary_splits_seen_from_unseen() -> None:
    from common.learning.evaluate import SEEN_DOMAIN_KEY, UNSEEN_DOMAINS_KEY, domain_summary

    out = domain_summary([("mnist", 0.9), ("usps", 0.5), ("mnist-m", 0.3), ("syn", 0.0)], own=1)
    assert out[SEEN_DOMAIN_KEY] == 0.5 and out[UNSEEN_DOMAINS_KEY] == pytest.approx(0.4)
    assert out["acc-domain-mnist"] == 0.9 and out["acc-domain-syn"] == 0.0 and len(out) == 6
    assert SEEN_DOMAIN_KEY not in domain_summary([("mnist", 0.9)], own=-1), "no domain of its own: no split"


def test_the_evaluated_model_is_tested_on_every_domain_and_split_by_the_clients_own() -> None:
    from common.data.federated import ClientData
    from common.data.shift import make_shift_plan
    from common.learning.evaluate import SEEN_DOMAIN_KEY, UNSEEN_DOMAINS_KEY, evaluate_client

    y = torch.arange(20) % 10
    domains = [(name, _images(y, 0 if d in (0, 2) else 1), y) for d, name in enumerate(DOMAINS)]
    test_x = _images(y, 0)
    plan = make_shift_plan(np.arange(20), np.arange(20), 0)
    data = ClientData(0, 10, (3, 4, 4), test_x, y, test_x, y, test_x, y, plan, 4, domain=1)
    extra = evaluate_client(_FirstPixel(), data, (0.0,), domains=domains).extra
    assert [extra[f"acc-domain-{name}"] for name in DOMAINS] == [1.0, 0.0, 1.0, 0.0]
    assert extra[SEEN_DOMAIN_KEY] == 0.0, "usps, the client's own domain, is read wrong by this model"
    assert extra[UNSEEN_DOMAINS_KEY] == pytest.approx(2 / 3), "mnist, mnist-m right; syn wrong"
    assert evaluate_client(_FirstPixel(), data, (0.0,)).extra == {}, "no domain sets: no domain metrics"


def test_every_client_reports_its_seen_and_unseen_domains(data_dir) -> None:
    from common.config import parse_run_config
    from common.learning.evaluate import SEEN_DOMAIN_KEY, UNSEEN_DOMAINS_KEY, shifted_metric_keys

    from .inprocess import InProcessFederation

    raw = {
        "algorithm": "ditto",
        "dataset": "digit-domains",
        "partition": "domains",
        "data-dir": str(data_dir),
        "num-rounds": 1,
        "fraction-train": 1.0,
        "local-epochs": 1,
        "model": "resnet10-s",
        "domain-share": 0.002,
        "domain-test-size": 60,
        "domain-eval-size": 40,
        "shift-degrees": "0",
    }
    cfg = parse_run_config(raw)
    fed = InProcessFederation(raw, 5)
    fed.train_round(1)
    fed.evaluate(1)
    rows = fed.round_log.eval["per_client"]
    assert len(rows) == 5 and fed.round_log.eval["failed"] == 0
    for pid, row in rows.items():
        assert set(shifted_metric_keys(cfg.evaluation)) <= set(row)
        own = DOMAINS[fed.data[int(pid)].domain]
        assert row[SEEN_DOMAIN_KEY] == row[f"acc-domain-{own}"]
        others = [row[f"acc-domain-{name}"] for name in DOMAINS if name != own]
        assert row[UNSEEN_DOMAINS_KEY] == pytest.approx(sum(others) / 3)
    from common.data.evalsets import domain_tests

    sets = domain_tests(cfg.data, 5)
    assert [name for name, _, _ in sets] == list(DOMAINS) and all(len(y) == 40 for _, _, y in sets)


def test_summary_shows_seen_and_unseen_domains() -> None:
    from server_app.results.shift import domain_shift_lines

    mean = {"acc-seen-domain": 0.8, "acc-unseen-domains": 0.3, **{f"acc-domain-{n}": 0.5 for n in DOMAINS}}
    lines = domain_shift_lines({"final": {"mean": mean, "std": dict.fromkeys(mean, 0.1)}})
    assert "| seen domain | unseen domains | mnist | usps | mnist-m | syn |" in lines
    assert "| 80.00 +/- 10.00 | 30.00 +/- 10.00 | " + " | ".join(["50.00 +/- 10.00"] * 4) + " |" in lines
    assert domain_shift_lines({"final": {"mean": {"acc-shift-0": 0.5}, "std": {}}}) == []
