"""FedDST server half (Bibikar et al., 2022; DM-PFL [KDD 2023] A.1.1): a sparse global model with periodic readjustment.

Paper: Zhang, Zhou, Wang, Tong, "DM-PFL: Hitchhiking Generic Federated Learning for Efficient Shift-Robust
Personalization", KDD 2023, doi:10.1145/3580305.3599311 (not on arXiv)."""

from __future__ import annotations

from flwr.app import ConfigRecord

from common.algorithms import FedDSTParams
from common.methods.dmpfl import aggregate_round
from common.wire.messages import READJUST_RATIO

from ..replies import TrainReply
from .sparse import SparseGlobalStrategy


class FedDSTStrategy(SparseGlobalStrategy):
    """Clients train w_g under m_g; every `readjust-interval` rounds they prune/regrow their copy of the mask.

    Aggregation is Eq. 5 over the union of the uploaded masks (no vote filter), and the new m_g keeps, per
    layer, the ERK-density share of the largest |w_g| among positions any client kept.
    """

    def readjust_ratio(self, server_round: int) -> float:
        """alpha_s in readjustment rounds (every `readjust-interval`), else 0."""
        params = self.cfg.params_as(FedDSTParams)
        return params.dst_readjust_ratio if server_round % params.readjust_interval == 0 else 0.0

    def round_config(self, server_round: int, partition_id: int) -> ConfigRecord:
        """Tells clients whether this is a readjustment round and by how much."""
        config = super().round_config(server_round, partition_id)
        config[READJUST_RATIO] = self.readjust_ratio(server_round)
        return config

    def values_only_round(self, server_round: int) -> bool:
        """A readjustment round uploads weights and masks; the others only the values on m_g."""
        return self.readjust_ratio(server_round) == 0.0

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """Eq. 5 over the union of client masks; new m_g by magnitude among positions any client kept."""
        self.count_private_uploads(replies)
        self.bound_uploads(replies)
        if self.cfg.dp == "central":  # m_g stays: the vote would release the clients' masks
            self.set_global(self.private_masked_average(replies))
            return
        uploads = [(r.payload[0], r.payload[1], r.weight) for r in replies]
        weights, masks = aggregate_round(self.global_named, uploads, self.densities, min_vote_fraction=0.0)
        self.set_global(weights, masks)
