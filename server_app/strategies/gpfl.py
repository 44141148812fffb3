"""GPFL on the server: the model's body and GPFL's added modules (the global category embedding, the conditional
valve) are held, sent and averaged by samples; the head stays on the clients (Zhang et al., "GPFL: Simultaneously
Learning Global and Personalized Feature Information for Personalized Federated Learning", ICCV 2023)."""

from __future__ import annotations

from common.config import ConfigError, RunConfig
from common.learning.models import ModelLayout
from common.methods.gpfl import added_layout_of

from ..clients import ClientRegistry
from .partial import PartialStrategy


class GPFLStrategy(PartialStrategy):
    """PartialStrategy over the model's layout extended by GPFL's modules, sharing all but the head."""

    def __init__(self, cfg: RunConfig, model: ModelLayout, clients: ClientRegistry) -> None:
        try:
            extended = added_layout_of(model, cfg.seed)
        except ValueError as exc:
            raise ConfigError(f"run-config 'model' {cfg.model!r}: {exc}") from None
        super().__init__(cfg, extended, clients)
