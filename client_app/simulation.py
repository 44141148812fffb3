"""Simulated faults and attacks of a client (mirroring server_app/faults.py): the error reply of a client the
server told to fail (drop-rate), and an attacking client's boosted upload and inflated sample count (run config
`attack-*`). A device runs none of them unless its run config asks."""

from __future__ import annotations

from flwr.app import Error, Message, RecordDict
from flwr.common.constant import ErrorCode

from common.data.federated import ClientData
from common.methods.robust import boosted_upload, walk_seed, walked_upload
from common.sections import FaultSettings
from common.wire.messages import ARRAYS, METRICS, NUM_EXAMPLES
from common.wire.records import to_record
from common.wire.validation import record_to_numpy


class SimulatedDrop(RuntimeError):
    """A client the server told to fail (run-config drop-rate); its reply carries this error's name."""


def simulated_drop(msg: Message, partition_id: int, drop_rate: float) -> Message:
    """The error reply of a client the server told to fail: the same reply as a ClientApp that raises (the code
    Flower gives one), but returned, so that no engine logs a traceback for it; the server logs the reason once."""
    reason = f"{SimulatedDrop.__name__}: client {partition_id} dropped this round (simulated, drop-rate {drop_rate:g})"
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)


def declared_num_train(faults: FaultSettings, data: ClientData) -> int:
    """The training-sample count this client declares: an attacker's `attack-declare` where set, else its own."""
    return faults.attack_declare if data.attacker and faults.attack_declare else data.num_train


def attacked_reply(faults: FaultSettings, data: ClientData, content: RecordDict, reply: RecordDict) -> RecordDict:
    """A training reply as an attacking client sends it: its update boosted by `attack-boost` against the model it
    received (or its walk step, `attack-walk`), its sample count the declared one; an honest client's reply
    unchanged."""
    if not data.attacker:
        return reply
    if ARRAYS in reply.array_records and ARRAYS in content.array_records:
        own, received = record_to_numpy(reply.array_records[ARRAYS]), record_to_numpy(content.array_records[ARRAYS])
        upload = (
            walked_upload(own, received, faults.attack_walk, walk_seed(faults.seed))
            if faults.attack_walk > 0
            else boosted_upload(own, received, faults.attack_boost)
        )
        reply[ARRAYS] = to_record(list(upload), list(upload.values()))
    if faults.attack_declare:
        reply.metric_records[METRICS][NUM_EXAMPLES] = faults.attack_declare
    return reply
