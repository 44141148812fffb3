"""GPFL on the server: the model's body and GPFL's added modules (the global category embedding, the conditional
valve) are held, sent and averaged by samples; the head stays on the clients (Zhang et al., "GPFL: Simultaneously
Learning Global and Personalized Feature Information for Personalized Federated Learning", ICCV 2023)."""

from __future__ import annotations

from common.methods.gpfl import added_layout_of

from .partial import AddedModulesStrategy


class GPFLStrategy(AddedModulesStrategy):
    """The model's layout extended by GPFL's modules, all but the head shared (the spec's `no-head`)."""

    add_modules = staticmethod(added_layout_of)
