"""A deployment (a real SuperLink, whose nodes are devices) with none of the keys that protect its algorithm (a robust
rule, a weight cap, an update bound) refuses to start in one line unless the operator sets allow-unprotected;
simulations never ask."""

from __future__ import annotations

import logging

import pytest
from flwr.app import Context, RecordDict

from common.algorithms import SPECS
from common.methods.robust import unprotected
from server_app.app import RunFailed, main


class DeviceGrid:
    """A SuperLink's grid as the ServerApp sees it: nothing may be asked of it before the check."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AssertionError(f"the grid was used ({name}) before the protection check")


class SimulatedGrid(DeviceGrid):
    simulation = True  # as the in-process engine's grid says


def context(**run_config) -> Context:
    return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)


def test_only_a_robust_rule_a_weight_cap_or_the_operators_word_let_a_deployment_start() -> None:
    keys = SPECS["fedavg"].protected_by
    assert "allow-unprotected=true" in unprotected("fedavg", keys, set(), False)
    assert unprotected("fedavg", keys, {"robust-aggregation"}, False) is None
    assert unprotected("fedavg", keys, {"max-weight-ratio"}, False) is None
    assert unprotected("fedavg", keys, set(), True) is None


def test_each_algorithm_is_protected_by_the_keys_that_act_on_it() -> None:
    """FedAMP weighs no sample counts: a weight cap protects nothing there, the update bound does; Local shares
    nothing and FedFomo's clients weigh peers by their own validation gain: nothing to set."""
    for name in ("fedamp", "heurfedamp"):
        keys = SPECS[name].protected_by
        assert keys == ("max-update-ratio",)
        assert "max-update-ratio=3" in unprotected(name, keys, {"max-weight-ratio"}, False)
        assert unprotected(name, keys, {"max-update-ratio"}, False) is None
    assert SPECS["dmpfl"].protected_by == ("max-weight-ratio",)
    assert SPECS["local"].protected_by == () == SPECS["fedfomo"].protected_by
    assert unprotected("local", (), set(), False) is None


def test_an_unprotected_deployment_stops_before_it_loads_data_or_asks_a_node(caplog, tmp_path) -> None:
    with caplog.at_level(logging.ERROR, logger="flwr"), pytest.raises(RunFailed, match="allow-unprotected"):
        main(DeviceGrid(), context(**{"results-dir": str(tmp_path)}))
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "max-weight-ratio=4" in errors[0].getMessage()
    assert list(tmp_path.iterdir()) == [], "no run folder made"


def test_a_fedamp_deployment_with_only_a_weight_cap_stops(tmp_path) -> None:
    run_config = {"results-dir": str(tmp_path), "algorithm": "fedamp", "max-weight-ratio": 4.0}
    with pytest.raises(RunFailed, match="without max-update-ratio"):
        main(DeviceGrid(), context(**run_config))


@pytest.mark.parametrize(
    ("grid", "run_config"),
    [
        (SimulatedGrid(), {}),
        (DeviceGrid(), {"max-weight-ratio": 4.0}),
        (DeviceGrid(), {"robust-aggregation": "clip"}),
        (DeviceGrid(), {"allow-unprotected": True}),
        (DeviceGrid(), {"algorithm": "heurfedamp", "max-update-ratio": 3.0}),
        (DeviceGrid(), {"algorithm": "local"}),
    ],
)
def test_a_protected_deployment_or_a_simulation_gets_past_the_check(grid, run_config, tmp_path) -> None:
    missing = tmp_path / "no-data"  # the next step fails on purpose: the check let it through
    with pytest.raises(RunFailed) as failed:
        main(
            grid, context(**{"results-dir": str(tmp_path), "dataset": "mnist", "data-dir": str(missing), **run_config})
        )
    assert "allow-unprotected" not in str(failed.value)
