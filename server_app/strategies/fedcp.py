"""FedCP on the server: the model (its head being the global head) and the conditional policy network are held, sent
and averaged by samples; each client's personal head stays on it (Zhang et al., "FedCP: Separating Feature
Information for Personalized Federated Learning via Conditional Policy", KDD 2023)."""

from __future__ import annotations

from common.methods.fedcp import added_layout_of

from .partial import AddedModulesStrategy


class FedCPStrategy(AddedModulesStrategy):
    """The model's layout extended by FedCP's policy network, all of it shared."""

    add_modules = staticmethod(added_layout_of)
