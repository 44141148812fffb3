"""The benchmarks' raw training loop: what it times and counts."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

import common.data.federated
import common.learning.models
import common.learning.train
from experiments.benchmarks.measure import raw_seconds


def test_raw_loop_leaves_out_the_processes_first_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first client trains once untimed: a process's one-time costs (a slow first call here) are not counted
    as training, and every client's samples are counted exactly once."""
    calls: list[int] = []
    sizes = {3: 40, 5: 70}

    def fake_data(settings: object, pid: int, clients: int) -> SimpleNamespace:
        return SimpleNamespace(input_shape=(1, 28, 28), num_classes=10, train_x=pid, train_y=None, num_train=sizes[pid])

    def fake_train(model: object, x: int, *args: object, **kwargs: object) -> None:
        calls.append(x)
        if len(calls) == 1:
            time.sleep(0.5)  # the first training of a process: imports, first allocations

    monkeypatch.setattr(common.data.federated, "client_data", fake_data)
    monkeypatch.setattr(common.learning.models, "build_model", lambda *a, **k: SimpleNamespace(to=lambda d: None))
    monkeypatch.setattr(common.learning.train, "train", fake_train)
    samples, seconds = raw_seconds({"algorithm": "fedavg", "local-epochs": 2}, 10, [3, 5])
    assert calls == [3, 3, 5]
    assert samples == 2 * (40 + 70)
    assert seconds < 0.25
