"""The per-process memo of results of received payloads: once per bytes object, never across other bytes, never
for a failure; and the sparse global model decoded once per round for all the clients a process serves."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from common.wire.payload_memo import PayloadMemo


def _record(value: float) -> ArrayRecord:
    """A large array (told apart by identity) and a small one (by content)."""
    return ArrayRecord({"w": Array(np.full(20_000, value, np.float32)), "b": Array(np.zeros(2, np.float32))})


def test_a_result_is_computed_once_per_payload_and_parameters() -> None:
    memo: PayloadMemo[int] = PayloadMemo(size=2)
    calls: list[str] = []

    def compute(tag: str) -> int:
        calls.append(tag)
        return len(calls)

    one, two = _record(1.0), _record(1.0)  # equal contents, other bytes objects
    assert memo.get(one, "p", lambda: compute("one")) == 1
    assert memo.get(one, "p", lambda: compute("again")) == 1, "the same bytes and parameters: remembered"
    assert memo.get(one, "q", lambda: compute("other params")) == 2
    assert memo.get(two, "p", lambda: compute("two")) == 3, "other bytes are computed anew, equal or not"
    assert memo.get(one, "p", lambda: compute("evicted")) == 4, "two kept: the oldest went"
    with pytest.raises(ValueError):
        memo.get(_record(2.0), "p", lambda: (_ for _ in ()).throw(ValueError("bad")))
    assert len(memo._entries) == 2 and calls == ["one", "other params", "two", "evicted"]


def test_small_arrays_are_told_apart_by_content_large_ones_by_identity() -> None:
    memo: PayloadMemo[int] = PayloadMemo(size=4)
    large = Array(np.zeros(20_000, np.float32))
    first = ArrayRecord({"w": large, "b": Array(np.ones(2, np.float32))})
    again = ArrayRecord({"w": large, "b": Array(np.ones(2, np.float32))})  # the small one rebuilt, as a pipe does
    other = ArrayRecord({"w": large, "b": Array(np.full(2, 2, np.float32))})
    assert again["b"].data is not first["b"].data
    assert memo.get(first, None, lambda: 1) == 1
    assert memo.get(again, None, lambda: 2) == 1, "equal small bytes, the same large ones: remembered"
    assert memo.get(other, None, lambda: 3) == 3, "other small bytes: computed"


def test_data_that_is_not_immutable_bytes_is_computed_every_time() -> None:
    memo: PayloadMemo[int] = PayloadMemo()
    record = ArrayRecord({"w": Array(dtype="float32", shape=(1,), stype="numpy.ndarray", data=b"x")})
    record["w"].data = bytearray(b"x")  # a buffer that could change under the memo
    calls: list[int] = []
    for _ in range(2):
        memo.get(record, None, lambda: calls.append(1) or 0)
    assert len(calls) == 2 and memo.key(record, None) is None


@pytest.mark.parametrize("algorithm", ["dmpfl", "feddst"])
def test_the_sparse_global_model_is_decoded_once_for_all_clients_of_a_round(monkeypatch, algorithm: str) -> None:
    import client_app.algorithms.sparse as sparse

    from .test_dmpfl import _federation

    decoded: list[int] = []
    real = sparse.decode_model
    monkeypatch.setattr(sparse, "decode_model", lambda arrays, *a, **k: decoded.append(1) or real(arrays, *a, **k))
    monkeypatch.setattr(sparse, "_RECEIVED", PayloadMemo())
    fed = _federation(algorithm, num_clients=6, **{"fraction-train": 1.0})
    fed.train_round(1)
    assert len(decoded) == 1, "six clients, one global payload, one decode"
    replies = fed.evaluate(1)
    assert len(replies) == 6
    for value in sparse._RECEIVED._entries[next(iter(sparse._RECEIVED._entries))][1][1].values():
        assert not value.flags.writeable, "shared between clients: read-only"


@pytest.mark.parametrize("algorithm", ["fedavg", "ditto"])
def test_an_evaluated_global_model_is_built_once_and_changes_no_metric(monkeypatch, algorithm: str) -> None:
    import client_app.algorithms.base as base

    from .test_dmpfl import _federation

    results = {}
    for shared in (True, False):
        with monkeypatch.context() as patch:
            patch.setattr(base, "_RECEIVED_MODELS", PayloadMemo(size=1))
            built: list[int] = []

            def counted(self, *args, _real=base.ClientAlgorithm.received_model, _built=built):
                _built.append(1)
                return _real(self, *args)

            patch.setattr(base.ClientAlgorithm, "received_model", counted)
            if not shared:
                patch.setattr(base.ClientAlgorithm, "received_model_to_read", base.ClientAlgorithm.received_model)
            fed = _federation(algorithm, num_clients=5, **{"fraction-train": 1.0, "shift-degrees": "0,1"})
            fed.train_round(1)
            built.clear()
            replies = fed.evaluate(1)
            results[shared] = len(built), {cid: dict(r.metric_records["metrics"]) for cid, r in replies.items()}
    assert results[True][0] == 1 and results[False][0] == 5, "one build for five clients"
    assert results[True][1] == results[False][1]
