"""FedBABU: only the body travels and trains, the head stays at the common initialization, and evaluation
fine-tunes a copy (the whole model or the head) while the global row reads the model as received."""

from __future__ import annotations

import numpy as np
import pytest

from common.config import ConfigError, parse_run_config

from .inprocess import InProcessFederation


def _federation(**overrides) -> InProcessFederation:
    raw = {"algorithm": "fedbabu", "dataset": "digits", "num-rounds": 3, "fraction-train": 1.0, "local-epochs": 1}
    return InProcessFederation({**raw, "lr": 0.1, **overrides}, 2)


def test_the_body_travels_and_the_head_never_moves() -> None:
    fed = _federation()
    initial = {name: a.copy() for (name, _), a in zip(fed.strategy.specs, fed.strategy.global_arrays)}
    replies = fed.train_round(1)
    assert list(fed.sent[1][0].array_records["arrays"].keys()) == ["body.1.weight", "body.1.bias"]
    for reply in replies.values():
        uploaded = reply.array_records["arrays"]
        assert list(uploaded.keys()) == ["body.1.weight", "body.1.bias"]
        assert not np.array_equal(uploaded["body.1.weight"].numpy(), initial["body.1.weight"])
    held = dict(zip([n for n, _ in fed.strategy.specs], fed.strategy.global_arrays))
    np.testing.assert_array_equal(held["head.weight"], initial["head.weight"])
    assert fed.states == {0: {}, 1: {}}  # nothing kept on the device


@pytest.mark.parametrize(("part", "epochs"), [("all", 2), ("head", 2), ("all", 0)])
def test_evaluation_fine_tunes_a_copy(part: str, epochs: int) -> None:
    fed = _federation(**{"fedbabu-finetune-part": part, "fedbabu-finetune-epochs": epochs})
    fed.train_round(1)
    metrics = fed.evaluate(1)[0].metric_records["metrics"]
    tuned, received = float(metrics["acc-shift-0"]), float(metrics["global-acc-shift-0"])
    if epochs == 0:
        assert tuned == received
    else:
        assert tuned != received


def test_bad_fine_tuning_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match="fedbabu-finetune-part"):
        parse_run_config({"algorithm": "fedbabu", "fedbabu-finetune-part": "body"})
    with pytest.raises(ConfigError, match="fedbabu-finetune-epochs"):
        parse_run_config({"algorithm": "fedbabu", "fedbabu-finetune-epochs": -1})
