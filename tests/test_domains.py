"""The four-domain Digits data set built offline, its `domains` partition and the per-domain evaluation rows."""

from __future__ import annotations

import numpy as np
import pytest

from common.data.arrays import DataError
from common.data.domains import DOMAINS, domain_partition, mnist_m, render_digits


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
    assert np.array_equal(grey[:, 0], grey[:, 2]) and grey[:, :, :2].max() == 0, "MNIST padded, grey"
    coloured = data.x[data.domain == 2]
    assert not np.array_equal(coloured[:, 0], coloured[:, 2]), "MNIST-M over colour photos"


def test_a_client_reports_the_global_model_on_its_domain(data_dir) -> None:
    from common.config import parse_run_config
    from server_app.replies import domain_key

    from .inprocess import InProcessFederation

    raw = {"algorithm": "fedavg", "dataset": "digit-domains", "partition": "domains", "data-dir": str(data_dir),
           "num-rounds": 1, "fraction-train": 1.0, "local-epochs": 1, "model": "resnet10-s", "domain-share": 0.002,
           "domain-test-size": 50, "shift-degrees": "0"}
    fed = InProcessFederation(parse_run_config(raw), 4)
    assert sorted(fed.data[pid].domain for pid in range(4)) == [0, 1, 2, 3]
    fed.evaluate(0)
    means = fed.round_log.eval["mean"]
    assert {domain_key(name) for name in DOMAINS} <= set(means)
    assert all(0.0 <= means[domain_key(name)] <= 1.0 for name in DOMAINS)
