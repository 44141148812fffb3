"""Hostile training replies: >= 1,000 malformed payloads through the server's reply path, none used, none fatal.

Every case sends three valid replies and one malformed one: the run must not crash, the bad reply must be
rejected with a log line naming its client and the reason, and the aggregate must equal the aggregate of
the three valid replies alone.
"""

from __future__ import annotations

import copy
import io
import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from common.config import parse_run_config
from common.wire.codec import encode_sparse, to_arrays
from common.wire.records import to_plain_record

from .fakes import FakeReply, hand_made_runner, train_content
from .inprocess import InProcessFederation

SPECS = [("body.w", (3, 4)), ("head.b", (5,))]
NAMES = [n for n, _ in SPECS]
CASES_PER_FAMILY = 600


def _raw_array(dtype: str, shape: tuple[int, ...], data: bytes) -> Array:
    return Array(dtype=dtype, shape=shape, stype="numpy.ndarray", data=data)


def _npy(value: np.ndarray, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, value, allow_pickle=allow_pickle)
    return buf.getvalue()


def _dense_mutations(rng: np.random.Generator, arrays: list[np.ndarray]) -> tuple[str, RecordDict]:
    """One malformed FedAvg-style reply (kind, content), from a valid model."""
    kind = rng.choice(
        [
            "missing-key",
            "extra-key",
            "shape",
            "dtype",
            "nan",
            "inf",
            "huge",
            "no-metrics",
            "bad-count",
            "bad-loss",
            "empty",
            "empty-arrays",
            "pickle",
            "truncated",
            "stype",
            "declared-shape",
        ]
    )
    content = train_content(NAMES, arrays, 10)
    record = content.array_records["arrays"]
    name = NAMES[int(rng.integers(len(NAMES)))]
    value = arrays[NAMES.index(name)].copy()
    if kind == "missing-key":
        del record[name]
    elif kind == "extra-key":
        record["extra.w"] = Array(np.zeros(2, np.float32))
    elif kind == "shape":
        record[name] = Array(value.reshape(-1)[: max(1, value.size - int(rng.integers(1, 3)))].copy())
    elif kind == "dtype":
        record[name] = Array(value.astype(rng.choice([np.float64, np.int32, np.float16])))
    elif kind in ("nan", "inf", "huge"):
        bad = {"nan": np.nan, "inf": float(rng.choice([np.inf, -np.inf])), "huge": float(10 ** rng.integers(7, 30))}
        flat = value.reshape(-1)
        flat[int(rng.integers(flat.size))] = bad[kind]
        record[name] = Array(value)
    elif kind == "no-metrics":
        del content["metrics"]
    elif kind == "bad-count":
        content["metrics"] = MetricRecord({"num-examples": rng.choice([-5, 0, 2.5, 10**12]), "train-loss": 0.5})
    elif kind == "bad-loss":
        content["metrics"] = MetricRecord({"num-examples": 10, "train-loss": float(rng.choice([np.nan, np.inf]))})
    elif kind == "empty":
        content = RecordDict()
    elif kind == "empty-arrays":
        content["arrays"] = ArrayRecord()
    elif kind == "pickle":
        record[name] = _raw_array(
            "float32",
            value.shape,
            _npy(np.array([{"x": 1}] * value.size, dtype=object).reshape(value.shape), allow_pickle=True),
        )
    elif kind == "truncated":
        data = _npy(value.astype(np.float32))
        record[name] = _raw_array("float32", value.shape, data[: len(data) - int(rng.integers(1, 16))])
    elif kind == "stype":
        record[name] = Array(dtype="float32", shape=value.shape, stype="torch.Tensor", data=_npy(value))
    elif kind == "declared-shape":
        record[name] = _raw_array("float32", (value.size + 1,), _npy(value.astype(np.float32)))
    return str(kind), content


def _dense_runner():
    cfg = parse_run_config({"fraction-train": 1.0})
    return hand_made_runner(cfg, SPECS, [np.zeros(s, np.float32) for _, s in SPECS], dict.fromkeys(range(4), 50))


def test_dense_reply_fuzz(caplog) -> None:
    rng = np.random.default_rng(0)
    runner = _dense_runner()
    kinds: dict[str, int] = {}
    for case in range(CASES_PER_FAMILY):
        models = [[rng.normal(size=s).astype(np.float32) for _, s in SPECS] for _ in range(4)]
        bad_pid = int(rng.integers(4))
        kind, bad = _dense_mutations(rng, models[bad_pid])
        kinds[kind] = kinds.get(kind, 0) + 1
        counts = {pid: int(rng.integers(1, 50)) for pid in range(4)}
        replies = [
            FakeReply(100 + pid, bad if pid == bad_pid else train_content(NAMES, models[pid], counts[pid]))
            for pid in range(4)
        ]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="flwr"):
            runner.aggregate_train(1, replies)
        assert runner.round_log.train["rejected"] == 1 and runner.round_log.train["used"] == 3, (case, kind)
        assert f"client {bad_pid}: training reply rejected:" in caplog.text, (case, kind)
        valid = [pid for pid in range(4) if pid != bad_pid]
        total = sum(counts[p] for p in valid)
        for i in range(len(SPECS)):
            expected = sum(counts[p] * models[p][i].astype(np.float64) for p in valid) / total
            np.testing.assert_allclose(runner.strategy.global_arrays[i], expected, rtol=1e-6, atol=1e-6)
    assert len(kinds) == 16, kinds


def _sparse_mutations(rng: np.random.Generator, arrays: dict[str, np.ndarray]) -> tuple[str, dict[str, np.ndarray]]:
    """One malformed sparse upload from a valid one: bitmask, nnz, digest, shape, values, keys."""
    out = {k: v.copy() for k, v in arrays.items()}
    sparse = sorted({k.rpartition("/")[0] for k in out if k.endswith("/bits")})
    name = sparse[int(rng.integers(len(sparse)))]
    kind = str(
        rng.choice(
            [
                "bits-truncated",
                "bits-oversized",
                "bits-dtype",
                "padding",
                "nnz-more",
                "nnz-less",
                "digest",
                "digest-negative",
                "shape",
                "values-nan",
                "values-dtype",
                "missing-values",
                "unknown-key",
                "too-dense",
                "dense-and-sparse",
                "huge-shape",
            ]
        )
    )
    if kind == "bits-truncated":
        out[f"{name}/bits"] = out[f"{name}/bits"][:-1]
    elif kind == "bits-oversized":
        out[f"{name}/bits"] = np.concatenate([out[f"{name}/bits"], np.zeros(int(rng.integers(1, 9)), np.uint8)])
    elif kind == "bits-dtype":
        out[f"{name}/bits"] = out[f"{name}/bits"].astype(np.int16)
    elif kind == "padding":
        n = int(np.prod(out[f"{name}/shape"]))
        if n % 8 == 0:  # no padding bits in this layer: truncate instead (still malformed)
            out[f"{name}/bits"] = out[f"{name}/bits"][:-1]
        else:
            out[f"{name}/bits"][-1] |= 1
    elif kind == "nnz-more":
        out[f"{name}/values"] = np.concatenate([out[f"{name}/values"], np.ones(1, np.float32)])
    elif kind == "nnz-less":
        out[f"{name}/values"] = out[f"{name}/values"][:-1]
    elif kind == "digest":
        out[f"{name}/digest"] = out[f"{name}/digest"] ^ np.int64(1 + int(rng.integers(1000)))
    elif kind == "digest-negative":
        out[f"{name}/digest"] = np.asarray([-1], np.int64)
    elif kind == "shape":
        shape = out[f"{name}/shape"].copy()
        shape[-1] += 1
        out[f"{name}/shape"] = shape
    elif kind == "values-nan":
        out[f"{name}/values"][int(rng.integers(out[f"{name}/values"].size))] = np.nan
    elif kind == "values-dtype":
        out[f"{name}/values"] = out[f"{name}/values"].astype(np.float64)
    elif kind == "missing-values":
        del out[f"{name}/values"]
    elif kind == "unknown-key":
        out[f"{name}/secret"] = np.zeros(1, np.float32)
    elif kind == "too-dense":  # a mask with every position set: more than the layer's density allows
        shape = tuple(int(d) for d in out[f"{name}/shape"])
        out.update(to_arrays(name, encode_sparse(np.ones(shape, np.float32), np.ones(shape, bool))))
    elif kind == "dense-and-sparse":
        out[f"{name}/dense"] = np.zeros(tuple(out[f"{name}/shape"]), np.float32)
    elif kind == "huge-shape":
        out[f"{name}/shape"] = np.asarray([2**40, 2**40], np.int64)
    return kind, out


def test_sparse_reply_fuzz(caplog) -> None:
    raw = {
        "algorithm": "feddst",
        "dataset": "digits",
        "num-rounds": 2,
        "fraction-train": 1.0,
        "local-epochs": 1,
        "sparsity": 0.8,
        "readjust-interval": 1,
    }  # round 1 readjusts: full bitmask uploads
    fed = InProcessFederation(raw, 4)
    strategy = fed.strategy
    shared = strategy.shared_payload(1)
    valid = {pid: fed.client(pid).fit(1, strategy.train_content(1, pid, shared)) for pid in range(4)}
    state = copy.deepcopy((strategy.global_arrays, strategy.global_masks, strategy.version))

    def aggregate(contents: dict[int, RecordDict]) -> list[np.ndarray]:
        strategy.global_arrays, strategy.global_masks, strategy.version = copy.deepcopy(state)
        fed.runner.aggregate_train(1, [FakeReply(1000 + pid, c) for pid, c in contents.items()])
        return [a.copy() for a in strategy.global_arrays]

    rng = np.random.default_rng(1)
    kinds: dict[str, int] = {}
    expected_by_bad: dict[int, list[np.ndarray]] = {}
    for case in range(CASES_PER_FAMILY):
        bad_pid = int(rng.integers(4))
        arrays = {k: v.numpy() for k, v in valid[bad_pid].array_records["arrays"].items()}
        kind, mutated = _sparse_mutations(rng, arrays)
        kinds[kind] = kinds.get(kind, 0) + 1
        bad = RecordDict({"arrays": to_plain_record(mutated), "metrics": valid[bad_pid].metric_records["metrics"]})
        if bad_pid not in expected_by_bad:
            expected_by_bad[bad_pid] = aggregate({p: c for p, c in valid.items() if p != bad_pid})
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="flwr"):
            got = aggregate({p: (bad if p == bad_pid else c) for p, c in valid.items()})
        assert fed.round_log.train["rejected"] == 1 and fed.round_log.train["used"] == 3, (case, kind)
        assert f"client {bad_pid}: training reply rejected:" in caplog.text, (case, kind)
        for a, b in zip(got, expected_by_bad[bad_pid]):
            np.testing.assert_array_equal(a, b)
    assert len(kinds) == 16, kinds


@pytest.mark.parametrize("algorithm", ["fedamp", "fliu", "fedfomo"])
def test_personalization_strategies_reject_a_pickled_array(algorithm: str, caplog) -> None:
    raw = {"algorithm": algorithm, "dataset": "digits", "fraction-train": 1.0, "local-epochs": 1}
    fed = InProcessFederation(raw, 2)
    replies = fed.train_round(1)
    content = replies[0]
    name = next(iter(content.array_records["arrays"].keys()))
    shape = tuple(content.array_records["arrays"][name].shape)
    content.array_records["arrays"][name] = _raw_array(
        "float32",
        shape,
        _npy(np.array([object()] * int(np.prod(shape)), dtype=object).reshape(shape), allow_pickle=True),
    )
    with caplog.at_level(logging.WARNING, logger="flwr"):
        fed.runner.aggregate_train(2, [FakeReply(1000, content)])
    assert fed.round_log.train["rejected"] == 1
    assert "client 0: training reply rejected" in caplog.text and "pickle" in caplog.text.lower()


@pytest.mark.parametrize("weights", [[1e308], [0.7, 0.7], [1.5, 0.0]])
def test_fedfomo_refuses_peer_weights_a_client_could_not_have_computed(weights: list[float], caplog) -> None:
    """FedFomo's client normalizes its peer weights to sum 1 (or sends zeros): a weight above 1, or weights summing
    above 1, would inflate the affinities that pick every later round's peers (1e308 made them infinite and the
    checkpoint unloadable)."""
    raw = {"algorithm": "fedfomo", "dataset": "digits", "fraction-train": 1.0, "local-epochs": 1, "fomo-models": 2}
    fed = InProcessFederation(raw, 3)
    fed.train_round(1)
    replies = fed.train_round(2)
    affinity = fed.strategy.affinity.copy()
    content = replies[0]
    metrics = content.metric_records["metrics"]
    for k, value in enumerate(weights):
        metrics[f"fomo-weight-{k}"] = value
    with caplog.at_level(logging.WARNING, logger="flwr"):
        fed.runner.aggregate_train(2, [FakeReply(1000, content)])
    assert fed.round_log.train["rejected"] == 1
    assert "client 0: training reply rejected" in caplog.text and "must be at most 1" in caplog.text
    np.testing.assert_array_equal(fed.strategy.affinity, affinity)
