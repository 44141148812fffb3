"""SCAFFOLD's client half: local SGD on the received global model with every gradient corrected by (c - c_i), then
option II's new c_i; c_i stays on the device, its change travels beside the model (Karimireddy et al., "SCAFFOLD:
Stochastic Controlled Averaging for Federated Learning", ICML 2020, Algorithm 1)."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import RecordDict

from common.learning.models import get_arrays
from common.methods.scaffold import client_control, corrected_gradients
from common.wire.messages import CONTROL
from common.wire.records import to_record
from common.wire.validation import validate_arrays

from .base import ClientAlgorithm

OWN_CONTROL = "scaffold/control"  # c_i in client state (zeros before the client's first round)


class ScaffoldClient(ClientAlgorithm):
    """y_i <- y_i - lr (g_i(y_i) - c_i + c) for `local-epochs`; c_i+ = c_i - c + (x - y_i) / (K lr); uploads y_i and
    c_i+ - c_i."""

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Train with the corrected gradients, keep c_i+, upload the model and the change of c_i."""
        layout = self.layout()
        params = set(layout.params)
        control_specs = [(name, shape) for name, shape in layout.specs if name in params]
        names = [name for name, _ in control_specs]
        c = validate_arrays(content.array_records.get(CONTROL), control_specs)
        saved = self.env.state.load_arrays(OWN_CONTROL)
        c_i = saved if saved is not None else [np.zeros(shape, np.float32) for _, shape in control_specs]
        model = self.received_model(content)
        received = self.snapshot(model)
        x = dict(zip([name for name, _ in layout.specs], get_arrays(model)))
        correction = {name: torch.from_numpy(np.asarray(cg - ci, np.float32)) for name, cg, ci in zip(names, c, c_i)}
        settings = self.settings(server_round)
        stats = self.train_locally(model, server_round, settings=settings, on_gradients=corrected_gradients(correction))
        y = dict(zip([name for name, _ in layout.specs], get_arrays(model)))
        new_c_i, delta = client_control(
            c_i, c, [x[name] for name in names], [y[name] for name in names], stats.steps, settings.lr
        )
        self.env.state.save_arrays(OWN_CONTROL, new_c_i)
        reply = self.train_reply(stats, model, stages={"G": received, "L1": received, "L2": model})
        reply[CONTROL] = to_record(names, delta)
        return reply
