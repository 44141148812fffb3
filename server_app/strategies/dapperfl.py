"""DapperFL server half (DapperFL [arXiv:2412.05823] Sec. 3.4): check each device's pruned upload
and channel masks against its pruning ratio, recover the pruned channels from the previous global model (Eq. 6)
and average by sample count (Eq. 7).

`dapperfl-variant = official` (the authors' public code as it runs): uploads are the full-shape model with the
pruned entries 0 and no channel masks; the zeros enter the sample-weighted average as they are (the public code's
recovery is overwritten by `prune.remove` before it averages), so Eq. 6 recovers nothing there.

Paper: Jia et al., "DapperFL: Domain Adaptive Federated Learning with Model Fusion Pruning for Edge Devices", NeurIPS
2024, arXiv:2412.05823."""

from __future__ import annotations

from typing import Any

import numpy as np

from common.algorithms import DapperFLParams
from common.config import ConfigError, RunConfig
from common.learning.models import ModelLayout
from common.methods.aggregate import weighted_average
from common.methods.channels import entry_indices, keep_count, pruned_shapes
from common.methods.dapperfl import OFFICIAL, recover_uploads
from common.wire.messages import ARRAYS, CHANNEL_MASKS
from common.wire.validation import PayloadError, validate_arrays

from ..clients import ClientRegistry
from ..replies import TrainReply, reply_flops
from .base import PFLStrategy


class DapperFLStrategy(PFLStrategy):
    """Sends the global model; takes back physically pruned models of different widths with their channel masks
    (`official`: full-shape models with zeros, averaged as they are)."""

    uploads_weights = False

    def __init__(self, cfg: RunConfig, model: ModelLayout, clients: ClientRegistry) -> None:
        super().__init__(cfg, model, clients)
        if not model.channels:
            raise ConfigError(f"dapperfl prunes output channels and model '{cfg.model}' has no channel plan")
        self.groups = list(model.channels)
        self.names = [name for name, _ in self.specs]
        self.ratios = cfg.params_as(DapperFLParams).dapperfl_ratios
        self.official = cfg.params_as(DapperFLParams).dapperfl_variant == OFFICIAL
        self.by_ratio: dict[str, dict[str, Any]] = {}  # the round's uploads grouped by pruning ratio

    def ratio(self, partition_id: int) -> float:
        """The pruning ratio of a client: the configured list cycled over partition ids."""
        return self.ratios[partition_id % len(self.ratios)]

    def decode_train_reply(self, server_round: int, reply: TrainReply) -> None:
        """Masks: one 0/1 uint8 vector per channel group keeping exactly the channels the client's ratio keeps;
        arrays: the model's entries at the widths those masks give, float32, finite (`official`: the full-shape
        model, no masks)."""
        content, ratio = reply.content, self.ratio(reply.partition_id)
        if self.official:
            full = validate_arrays(content.array_records.get(ARRAYS), self.specs)
            reply.payload = (dict(zip(self.names, full, strict=True)), {})
            return
        flags = validate_arrays(
            content.array_records.get(CHANNEL_MASKS),
            [(f"group-{i}", (g.size,)) for i, g in enumerate(self.groups)],
            dtype="uint8",
        )
        masks = []
        for i, (group, flag) in enumerate(zip(self.groups, flags, strict=True)):
            if np.any(flag > 1):
                raise PayloadError(f"channel mask group-{i} holds values other than 0 and 1")
            kept, expected = int(flag.sum()), keep_count(group.size, ratio)
            if kept != expected:
                raise PayloadError(
                    f"channel mask group-{i} keeps {kept} of {group.size} channels; the client's "
                    f"pruning ratio {ratio:g} keeps {expected}"
                )
            masks.append(flag.astype(bool))
        indices = entry_indices(self.groups, masks, self.specs)
        arrays = validate_arrays(content.array_records.get(ARRAYS), pruned_shapes(self.specs, indices))
        reply.payload = (dict(zip(self.names, arrays, strict=True)), indices)

    def aggregate(self, server_round: int, replies: list[TrainReply]) -> None:
        """Eq. 6 then Eq. 7: pruned channels from the previous global model, then the sample-weighted average
        (`official`: the full-shape uploads, zeros included, averaged as they are)."""
        self.by_ratio = {}
        for reply in replies:
            entry = self.by_ratio.setdefault(
                f"{self.ratio(reply.partition_id):g}", {"clients": [], "values": 0, "train_flops": []}
            )
            entry["clients"].append(reply.partition_id)
            entry["values"] = sum(int(a.size) for a in reply.payload[0].values())
            entry["train_flops"].append(reply_flops(reply.content))
        payloads: list[Any] = [r.payload for r in replies]
        recovered = recover_uploads(self.global_arrays, self.names, [p[0] for p in payloads], [p[1] for p in payloads])
        # run-config max-update-ratio: a pruned entry's update is 0 (it is the previous global's)
        if self.cfg.dp == "central":  # each recovered update clipped (0 where pruned), noise on every coordinate
            contributions, _ = self.dp_contributions(recovered, self.global_arrays)
            self.global_arrays = self.private_mean(contributions, self.global_arrays)
        else:
            bounded = self.bound_to_peers(recovered, self.global_arrays)
            self.global_arrays = weighted_average(bounded, [r.weight for r in replies])
            if self.cfg.dp == "local":
                self.aggregation_fields = {"dp": self.count_local_dp(replies)}

    def round_record(self, server_round: int) -> dict[str, Any]:
        """The round's uploads by pruning ratio: clients, values uploaded per client, training FLOPs per client."""
        record = {
            "by_ratio": {
                ratio: {"clients": e["clients"], "values": e["values"], "train_flops": float(np.mean(e["train_flops"]))}
                for ratio, e in sorted(self.by_ratio.items(), key=lambda item: float(item[0]))
            }
        }
        self.by_ratio = {}
        return record if record["by_ratio"] else {}
