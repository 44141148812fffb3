"""Client halves in-process (no Flower runtime): replies, FedProx's pull, Local's persistent state."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

from client_app.algorithms import ClientEnv, client_class
from client_app.algorithms.local import PERSONAL
from client_app.state import ClientState, Tree
from common.config import parse_run_config
from common.data.federated import client_data
from common.learning.evaluate import shift_key
from common.learning.models import array_specs, get_arrays
from common.wire.records import to_record
from common.wire.validation import validate_arrays


def _client(name: str, state: Tree | None = None, **overrides):
    cfg = parse_run_config({"algorithm": name, "dataset": "digits", "local-epochs": 2, "lr": 0.1, **overrides})
    env = ClientEnv(cfg, client_data(cfg.data, 1, 4), ClientState(state if state is not None else {}), "cpu")
    return client_class(name)(env)


def _global_content(client, server_round: int = 1) -> RecordDict:
    model = client.new_model()
    return RecordDict(
        {
            "arrays": to_record([n for n, _ in array_specs(model)], get_arrays(model)),
            "config": ConfigRecord({"server-round": server_round}),
        }
    )


def _distance(arrays, reference) -> float:
    return float(sum(np.sum((a - b) ** 2) for a, b in zip(arrays, reference)))


def test_fedavg_reply_is_a_valid_trained_model() -> None:
    client = _client("fedavg")
    content = _global_content(client)
    reply = client.fit(1, content)
    specs = array_specs(client.new_model())
    arrays = validate_arrays(reply.array_records["arrays"], specs)
    metrics = reply.metric_records["metrics"]
    assert metrics["num-examples"] == client.env.data.num_train and metrics["steps"] > 0
    assert _distance(arrays, get_arrays(client.new_model())) > 0
    again = validate_arrays(_client("fedavg").fit(1, content).array_records["arrays"], specs)
    assert all(np.array_equal(a, b) for a, b in zip(arrays, again)), "same seed, same update"


def test_fedprox_stays_closer_to_the_global_model() -> None:
    start = get_arrays(_client("fedavg").new_model())
    specs = array_specs(_client("fedavg").new_model())
    plain = validate_arrays(_client("fedavg").fit(1, _global_content(_client("fedavg"))).array_records["arrays"], specs)
    prox_client = _client("fedprox", **{"proximal-mu": 0.0})  # the client uses the mu the server sends
    content = _global_content(prox_client)
    content.config_records["config"]["prox-mu"] = 10.0
    prox = validate_arrays(prox_client.fit(1, content).array_records["arrays"], specs)
    assert _distance(prox, start) < 0.5 * _distance(plain, start)


def test_fedprox_server_sends_its_mu_and_a_bad_mu_fails_the_client() -> None:
    from common.wire.validation import PayloadError
    from server_app.clients import ClientRegistry
    from server_app.strategies import strategy_class

    cfg = parse_run_config({"algorithm": "fedprox", "proximal-mu": 0.25})
    model = _client("fedprox").new_model()
    from common.learning.models import ModelLayout

    strategy = strategy_class("fedprox")(cfg, ModelLayout.of(model), ClientRegistry())
    assert strategy.round_config(3, 1)["prox-mu"] == 0.25
    client = _client("fedprox")
    for bad in (-1.0, float("nan"), float("inf")):
        content = _global_content(client)
        content.config_records["config"]["prox-mu"] = bad
        with pytest.raises(PayloadError, match="prox-mu"):
            client.fit(1, content)
    with pytest.raises(PayloadError, match="prox-mu"):
        client.fit(1, _global_content(client))  # missing


def test_local_keeps_its_model_on_the_device_and_uploads_none() -> None:
    state: Tree = {}
    client = _client("local", state)
    reply = client.fit(1, RecordDict({"config": ConfigRecord({"server-round": 1})}))
    assert "arrays" not in reply.array_records
    first = ClientState(state).load_arrays(PERSONAL)
    assert first is not None and _distance(first, get_arrays(client.new_model())) > 0
    _client("local", state).fit(2, RecordDict({"config": ConfigRecord({"server-round": 2})}))
    second = ClientState(state).load_arrays(PERSONAL)
    assert _distance(second, first) > 0, "round 2 continued from the stored model"
    result = _client("local", state).evaluate(2, RecordDict())
    assert 0.0 <= result.metric_records["metrics"][shift_key(1.0)] <= 1.0


def test_fedavg_ft_evaluates_a_fine_tuned_copy() -> None:
    content = _global_content(_client("fedavg"))
    plain = _client("fedavg").evaluate(1, content).metric_records["metrics"]
    tuned = _client("fedavg-ft").evaluate(1, content).metric_records["metrics"]
    again = _client("fedavg-ft").evaluate(1, content).metric_records["metrics"]
    assert tuned["loss"] < plain["loss"], "fine-tuning on local data lowers the local test loss"
    assert dict(tuned) == dict(again)
