"""SecAgg+'s pure core: the unmasked sum is the plain sum exactly, with and without dropouts; masked vectors look
uniform; a client refuses to give both secrets of one neighbour; the encoding's sums; unsafe settings refused."""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy import stats

from common.methods.dmpfl import aggregate_masked
from common.secagg.encoding import Layout, Section, decode, encode, plain_sum, weight_units
from common.secagg.params import SecAggParams
from common.secagg.protocol import ClientSession, SecAggAborted, SecAggRefused, ServerSession, mask, ring_neighbours

PARAMS = SecAggParams(num_shares=5, reconstruction_threshold=3, modulus_range=2**32)


def run_round(
    vectors: dict[int, np.ndarray],
    params: SecAggParams = PARAMS,
    drop_before_sharing: frozenset[int] = frozenset(),
    drop_before_vector: frozenset[int] = frozenset(),
    drop_before_unmask: frozenset[int] = frozenset(),
) -> tuple[np.ndarray, ServerSession]:
    """One round of the protocol in process; clients in a drop set stop answering at that stage."""
    cohort = params.for_cohort(len(vectors))
    size = next(iter(vectors.values())).size
    server = ServerSession(cohort, list(vectors), size, random.Random(7))
    clients = {nid: ClientSession(nid, cohort) for nid in vectors}
    keys = {nid: c.advertise() for nid, c in clients.items()}
    key_requests = server.share_requests(keys)
    shared = {nid: clients[nid].share_keys(ks) for nid, ks in key_requests.items() if nid not in drop_before_sharing}
    routed = server.masked_requests(shared)
    masked = {
        nid: clients[nid].masked(cts, vectors[nid]) for nid, cts in routed.items() if nid not in drop_before_vector
    }
    asks = server.unmask_requests(masked)
    replies = {nid: clients[nid].unmask(*ask) for nid, ask in asks.items() if nid not in drop_before_unmask}
    return server.finish(replies), server


def share_stages(server: ServerSession, clients: dict[int, ClientSession]) -> dict[int, dict[int, bytes]]:
    """Stages 0 and 1 with every client answering: each client's routed ciphertexts."""
    requests = server.share_requests({nid: client.advertise() for nid, client in clients.items()})
    return server.masked_requests({nid: clients[nid].share_keys(keys) for nid, keys in requests.items()})


def int_vectors(n: int, size: int, seed: int = 0, high: int = 2**22) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {100 + 3 * i: rng.integers(0, high, size, dtype=np.uint64) for i in range(n)}


def test_unmasked_sum_is_the_plain_sum_exactly() -> None:
    vectors = int_vectors(9, 257)
    total, server = run_round(vectors)
    assert np.array_equal(total, plain_sum(list(vectors.values()), PARAMS))
    assert server.survivors == set(vectors) and not server.rejected


def test_dropouts_at_each_stage_leave_the_survivors_sum() -> None:
    vectors = int_vectors(12, 64, seed=1)
    params = SecAggParams(num_shares=7, reconstruction_threshold=4)
    graph = ring_neighbours(list(vectors), 7, random.Random(7))  # the server's graph in run_round
    first = sorted(vectors)[3]
    second = min(graph[first] - {first})  # two neighbours that both vanish after sharing: their mutual mask
    late = max(set(vectors) - {first, second})  # is in no vector; the late one's vector is, its seed rebuilt
    early = min(set(vectors) - {first, second, late})
    total, server = run_round(
        vectors,
        params,
        drop_before_sharing=frozenset({early}),
        drop_before_vector=frozenset({first, second}),
        drop_before_unmask=frozenset({late}),
    )
    assert server.survivors == set(vectors) - {early, first, second}
    assert np.array_equal(total, plain_sum([vectors[nid] for nid in server.survivors], PARAMS))


def test_too_many_dropouts_abort_the_round() -> None:
    vectors = int_vectors(5, 8)
    with pytest.raises(SecAggAborted, match="masked vectors"):
        run_round(vectors, drop_before_vector=frozenset(sorted(vectors)[:3]))


def test_masked_vectors_of_different_updates_look_alike() -> None:
    """All-zero and all-maximum updates: each client's masked vector is uniform over [0, modulus) either way."""
    size = 4000
    zeros = {nid: np.zeros(size, np.uint64) for nid in range(1, 6)}
    highs = {nid: np.full(size, 2**22, np.uint64) for nid in range(1, 6)}
    seen = []
    for vectors in (zeros, highs):
        cohort = PARAMS.for_cohort(5)
        server = ServerSession(cohort, list(vectors), size, random.Random(1))
        clients = {nid: ClientSession(nid, cohort) for nid in vectors}
        routed = share_stages(server, clients)
        seen.append(clients[1].masked(routed[1], vectors[1]).astype(np.float64) / 2**32)
    for masked in seen:
        assert stats.kstest(masked, "uniform").pvalue > 1e-3
    assert stats.ks_2samp(seen[0], seen[1]).pvalue > 1e-3
    assert seen[0].mean() == pytest.approx(0.5, abs=0.02)  # without the masks it would be 0


def test_a_client_refuses_both_secrets_of_one_neighbour() -> None:
    vectors = int_vectors(5, 4)
    cohort = PARAMS.for_cohort(5)
    server = ServerSession(cohort, list(vectors), 4, random.Random(3))
    clients = {nid: ClientSession(nid, cohort) for nid in vectors}
    routed = share_stages(server, clients)
    for nid, cts in routed.items():
        clients[nid].masked(cts, vectors[nid])
    me, other, third = sorted(vectors)[:3]
    alive = [nid for nid in sorted(vectors) if nid != third]
    with pytest.raises(SecAggRefused, match="named twice"):
        clients[me].unmask(alive, [other])  # `other` both survived and dropped
    with pytest.raises(SecAggRefused, match="expected"):
        clients[me].unmask(alive, [third])  # a second request in the same round
    with pytest.raises(SecAggRefused, match="cannot be a dropout"):
        clients[other].unmask([n for n in alive if n != other], [other])
    shares = clients[third].unmask(alive + [third], [])
    assert set(shares) == set(alive) | {third}


def test_a_client_refuses_stages_out_of_order_and_altered_keys() -> None:
    cohort = PARAMS.for_cohort(5)
    client = ClientSession(1, cohort)
    with pytest.raises(SecAggRefused, match="expected 'advertise'"):
        client.masked({}, np.zeros(3, np.uint64))
    pk1, pk2 = client.advertise()
    others = {nid: ClientSession(nid, cohort).advertise() for nid in (2, 3)}
    with pytest.raises(SecAggRefused, match="altered"):
        client.share_keys({1: (pk2, pk1), **others})


def test_server_leaves_out_a_client_that_skips_a_neighbour() -> None:
    vectors = int_vectors(6, 5)
    cohort = SecAggParams(num_shares=6, reconstruction_threshold=4).for_cohort(6)
    server = ServerSession(cohort, list(vectors), 5, random.Random(0))
    clients = {nid: ClientSession(nid, cohort) for nid in vectors}
    requests = server.share_requests({n: c.advertise() for n, c in clients.items()})
    sent = {nid: clients[nid].share_keys(k) for nid, k in requests.items()}
    cheat = sorted(vectors)[0]
    sent[cheat].pop(next(iter(sent[cheat])))
    routed = server.masked_requests(sent)
    assert cheat not in server.shared and "exactly its neighbours" in server.rejected[0]
    masked = {nid: clients[nid].masked(cts, vectors[nid]) for nid, cts in routed.items()}
    replies = {nid: clients[nid].unmask(*ask) for nid, ask in server.unmask_requests(masked).items()}
    honest = [v for nid, v in vectors.items() if nid != cheat]
    assert np.array_equal(server.finish(replies), plain_sum(honest, PARAMS))


def test_mask_is_seeded_uniform_and_below_the_modulus() -> None:
    a, b = mask(b"seed-a", 10_000, 2**20), mask(b"seed-b", 10_000, 2**20)
    assert np.array_equal(a, mask(b"seed-a", 10_000, 2**20)) and not np.array_equal(a, b)
    assert a.dtype == np.uint64 and int(a.max()) < 2**20
    assert stats.kstest(a / 2**20, "uniform").pvalue > 1e-3


def test_ring_neighbours_are_symmetric_of_the_share_count() -> None:
    graph = ring_neighbours(list(range(20)), 5, random.Random(4))
    assert all(len(ns) == 5 and nid in ns for nid, ns in graph.items())
    assert all(nid in graph[other] for nid, ns in graph.items() for other in ns)


@pytest.mark.parametrize(
    ("params", "clients", "message"),
    [
        (SecAggParams(num_shares=5, reconstruction_threshold=2), 10, "more than half"),
        (SecAggParams(num_shares=5, reconstruction_threshold=0.4), 10, "more than half"),
        (SecAggParams(modulus_range=3 * 2**30), 10, "power of two"),
        (SecAggParams(quantization_range=2**22, modulus_range=2**32), 1024, "at least 8589934592"),
        (SecAggParams(num_shares=2), 10, "at least 3"),
        (SecAggParams(), 2, "at least 3 clients"),
    ],
)
def test_unsafe_or_broken_settings_are_refused(params: SecAggParams, clients: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        params.for_cohort(clients)


def test_cohort_resolution() -> None:
    cohort = SecAggParams(num_shares=0.3, reconstruction_threshold=0.5).for_cohort(20)
    assert (cohort.shares, cohort.threshold) == (7, 4)  # 6 made odd, then ceil(3.5)
    full = SecAggParams(num_shares=1.0, reconstruction_threshold=0.67).for_cohort(4)
    assert (full.shares, full.threshold) == (4, 3)


def test_encoding_weighted_mean_within_quantization_error() -> None:
    params = SecAggParams(clipping_range=4.0, quantization_range=2**22, modulus_range=2**40, max_weight=100.0)
    layout = Layout((Section("w", 6), Section("votes", 6, "integer", bound=1)))
    rng = np.random.default_rng(0)
    xs = [np.array([0.5, -1.0, 2.0, 0.0, 3.9, -3.9]), np.array([1.5, 1.0, -2.0, 0.25, 0.1, 0.2])]
    weights = [30.0, 10.0]
    votes = [np.array([1, 0, 1, 1, 0, 0]), np.array([1, 1, 0, 1, 0, 1])]
    encoded = [encode(layout, {"w": x, "votes": v}, w, params, rng)[0] for x, v, w in zip(xs, votes, weights)]
    decoded = decode(layout, plain_sum(encoded, params), 2, params)
    expected = (30 * xs[0] + 10 * xs[1]) / 40
    step = 2 * params.clipping_range / params.quantization_range
    assert np.max(np.abs(decoded.mean("w") - expected)) < 2 * step * params.max_weight / 40
    assert decoded.integers["votes"].tolist() == [2, 1, 1, 2, 0, 1]
    assert decoded.weight_units == weight_units(30, params)[0] + weight_units(10, params)[0]


def test_encoding_refuses_bad_values_and_caps_the_weight() -> None:
    layout = Layout((Section("w", 2), Section("n", 2, "integer", bound=3)))
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="not finite"):
        encode(layout, {"w": np.array([np.nan, 0.0]), "n": np.array([0, 1])}, 5, PARAMS, rng)
    with pytest.raises(ValueError, match=r"outside \[0, 3\]"):
        encode(layout, {"w": np.zeros(2), "n": np.array([0, 4])}, 5, PARAMS, rng)
    with pytest.raises(ValueError, match="3 values for 2"):
        encode(layout, {"w": np.zeros(3), "n": np.array([0, 1])}, 5, PARAMS, rng)
    vector, capped = encode(layout, {"w": np.zeros(2), "n": np.array([0, 1])}, 5000, PARAMS, rng)
    assert capped and int(vector[0]) == PARAMS.quantization_range


def test_masked_dmpfl_aggregate_under_secagg_matches_the_plain_one() -> None:
    """Eq. 5 of DM-PFL on one layer (values on each client's mask, size-weighted, per-coordinate denominators,
    votes) through the protocol equals `aggregate_masked` within quantization error; the votes exactly."""
    params = SecAggParams(
        num_shares=5, reconstruction_threshold=3, clipping_range=2.0, modulus_range=2**40, max_weight=500.0
    )
    rng = np.random.default_rng(5)
    shape, n = (6, 7), 5
    old = rng.normal(size=shape).astype(np.float32)
    masks = [rng.random(shape) < 0.5 for _ in range(n)]
    values = [rng.normal(size=int(m.sum())).astype(np.float32) * 0.5 for m in masks]
    sizes = [float(s) for s in rng.integers(20, 400, n)]
    expected, votes = aggregate_masked(old, values, masks, sizes)
    size = old.size
    layout = Layout(
        (
            Section("w", size),
            Section("denominator", size, "integer", params.quantization_range),
            Section("votes", size, "integer", 1),
        )
    )
    vectors = {}
    for nid, (v, m, s) in enumerate(zip(values, masks, sizes), start=1):
        dense = np.zeros(size)
        dense[np.flatnonzero(m.reshape(-1))] = v
        units = weight_units(s, params)[0]
        content = {"w": dense, "denominator": units * m.reshape(-1).astype(np.int64), "votes": m.reshape(-1)}
        vectors[nid] = encode(layout, content, s, params, rng)[0]
    total, _ = run_round(vectors, params)
    decoded = decode(layout, total, n, params)
    got = decoded.masked_mean("w", "denominator", old).reshape(shape)
    assert np.array_equal(decoded.integers["votes"].reshape(shape), votes)
    assert np.max(np.abs(got - expected)) < 1e-4
