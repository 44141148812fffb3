"""FedALA's client half: before local training, the received global model and the client's last local model are
mixed element-wise in the top layers by weights the client learns on a slice of its data (the lower layers taken
from the global model); the mix is trained as FedAvg's model and uploaded; the trained model and the weights stay on
the device (Zhang et al., "FedALA: Adaptive Local Aggregation for Personalized Federated Learning", AAAI 2023,
Algorithm 1)."""

from __future__ import annotations

import torch
from flwr.app import RecordDict

from common.algorithms import GLOBAL, FedALAParams
from common.learning.models import SplitModel, get_arrays
from common.learning.train import TrainStats
from common.methods.fedala import ALASettings, adaptive_local_aggregation, top_names

from .base import ClientAlgorithm

LOCAL = "fedala/local"  # the model this client's last local training ended with
WEIGHTS = "fedala/weights"  # the learned aggregation weights of the top parameters, by name


class FedALAClient(ClientAlgorithm):
    """Adaptive local aggregation, then FedAvg's local training; evaluation reports the aggregation the client's
    next training would start from (its weights learned for it, not kept) and the received model ('global-')."""

    def initialization(self, received: SplitModel, server_round: int, purpose: str) -> tuple[SplitModel, int]:
        """The received model turned into this client's starting point (unchanged before it has trained: the
        authors' first round), the weights kept when `purpose` is training; and the ALA epochs it took."""
        saved = self.env.state.load_arrays(LOCAL)
        if saved is None:
            return received, 0
        params = self.cfg.params_as(FedALAParams)
        model = self.new_model(saved)  # its buffers stay the local model's, as the authors' code keeps them
        local = {name: p.detach().clone() for name, p in model.named_parameters()}
        global_ = {name: p.detach() for name, p in received.named_parameters()}
        top = top_names(model, params.fedala_layer_idx)
        stored = self.env.state.load_named(WEIGHTS)
        weights = None if stored is None else {name: torch.from_numpy(stored[name].copy()) for name in top}
        x, y = self.ala_slice(server_round, params.fedala_rand_percent, purpose)
        settings = ALASettings(
            params.fedala_eta, self.cfg.training.batch_size, params.fedala_threshold, params.fedala_max_start_epochs
        )
        learned, epochs = adaptive_local_aggregation(model, local, global_, weights, top, x, y, settings)
        if purpose == "train":
            self.env.state.save_named(WEIGHTS, {name: w.numpy() for name, w in learned.items()})
        return model, epochs

    def ala_slice(self, server_round: int, percent: int, purpose: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A contiguous `percent`% of the training data from a seeded start (the authors' sampling)."""
        data = self.env.data
        count = int(percent / 100 * len(data.train_y))
        generator = self.generator(server_round, f"ala-{purpose}")
        start = int(torch.randint(0, len(data.train_y) - count + 1, (1,), generator=generator))
        return data.train_x[start : start + count], data.train_y[start : start + count]

    def fit(self, server_round: int, content: RecordDict) -> RecordDict:
        """ALA, then `local-epochs` on the result; keep it, upload it."""
        received = self.received_model(content)
        before = self.snapshot(received)
        model, ala_epochs = self.initialization(received, server_round, "train")
        start = self.snapshot(model)
        stats = self.train_locally(model, server_round)
        self.env.state.save_arrays(LOCAL, get_arrays(model))
        params = self.cfg.params_as(FedALAParams)
        ala_samples = int(params.fedala_rand_percent / 100 * len(self.env.data.train_y))
        ala = TrainStats(num_samples=ala_samples, steps=ala_epochs, mean_loss=0.0)
        top = set(top_names(model, params.fedala_layer_idx))
        # weight learning: forward passes and the top parameters' gradients over the slice, once per ALA epoch
        flops = self.train_flops(stats) + self.train_flops(ala, trainable=top, epochs=ala_epochs)
        return self.train_reply(stats, model, stages={"G": before, "L1": start, "L2": model}, flops=flops)

    def evaluate(self, server_round: int, content: RecordDict) -> RecordDict:
        """ALA of the kept model and the received one (main accuracy), and the received model ('global-' row)."""
        received = self.received_model(content)
        global_row = self.row(GLOBAL, received)
        model, _ = self.initialization(received, server_round, "evaluate")
        return self.eval_reply(self.evaluate_model(model), global_row)
