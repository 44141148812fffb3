"""FedAMP / HeurFedAMP client half: train toward the personalized cloud model u_i with a proximal term."""

from __future__ import annotations

from dataclasses import replace

from flwr.app import RecordDict

from common.evaluate import CLOUD_PREFIX, shift_key
from common.models import get_arrays, set_arrays
from common.train import proximal_loss, train
from common.validation import PayloadError

from .base import ClientAlgorithm
from .local import PERSONAL

CLOUD = "cloud"


class FedAMPClient(ClientAlgorithm):
    """Minimizes F_i(w) + (lambda / (2 alpha_k)) ||w - u_i||^2 from u_i (papers/004 Eq. 5); keeps w_i and u_i.

    A pre-training message (config 'pretrain') trains `pretrain-epochs` from the common initialization.
    """

    name = "fedamp"

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """Pre-train, or train from u_i with the proximal pull toward it; upload w_i."""
        config = content.config_records["config"]
        model = self.received_model(content)
        settings = self.settings(server_round)
        if config.get("pretrain", False):
            settings = replace(settings, epochs=int(self.cfg.extra.get("pretrain-epochs", 1)))
            extra = []
        else:
            mu = float(config.get("prox-mu", 0.0))
            if not mu >= 0.0 or mu == float("inf"):
                raise PayloadError(f"prox-mu must be a finite non-negative number, got {mu}")
            self.env.state.save_arrays(CLOUD, get_arrays(model))
            extra = [proximal_loss(dict(model.named_parameters()), mu)]
        cloud = self.snapshot(model)
        stats = train(model, self.env.data.train_x, self.env.data.train_y, settings,
                      self.generator(server_round, "pretrain" if not extra else "train"), extra_losses=extra,
                      device=self.env.device)
        self.env.state.save_arrays(PERSONAL, get_arrays(model))
        return self.train_reply(stats, model, stages={"L1": cloud, "L2": model})

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """The local model w_i (main accuracy) and the last received cloud model u_i ('cloud-' metrics)."""
        personal = self.new_model()
        saved = self.env.state.load_arrays(PERSONAL)
        if saved is not None:
            set_arrays(personal, saved)
        extra: dict[str, float] = {}
        cloud_arrays = self.env.state.load_arrays(CLOUD)
        if cloud_arrays is not None:
            cloud = self.new_model()
            set_arrays(cloud, cloud_arrays)
            result = self.evaluate_model(cloud)
            extra = {CLOUD_PREFIX + shift_key(d): acc for d, acc in result.shift_accuracy.items()}
        return self.eval_reply(self.evaluate_model(personal), extra)


class HeurFedAMPClient(FedAMPClient):
    """HeurFedAMP's client step is FedAMP's; only the server's attention differs."""

    name = "heurfedamp"
