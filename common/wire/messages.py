"""Every name that travels in a message, declared once (as run-config keys are in config.py): the records a message
holds, the server's instructions in its 'config' record, what a client reports in its 'metrics' record, and the node
config a SuperNode is started with. Code uses these constants; tests/test_messages.py checks that no module spells a
declared name out instead. Families of names made by a function (accuracies per shift degree, corruption and domain:
common.learning.evaluate; stage accuracies: common.learning.stages) are declared there."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MessageKey:
    """A name in messages: where it travels and what it means."""

    name: str
    where: tuple[str, ...]  # "record" (a record's name), "config" (server -> client), "metrics" (client -> server),
    # "node" (a SuperNode's node config), "secagg" (inside the secure-aggregation record)
    help: str


KEYS: dict[str, MessageKey] = {}


def _key(name: str, where: tuple[str, ...], help_text: str) -> str:
    KEYS[name] = MessageKey(name, where, help_text)
    return name


# ----- records -------------------------------------------------------------------------------------------------
CONFIG = _key("config", ("record",), "the server's instructions for this message")
METRICS = _key("metrics", ("record",), "what the client reports: sample counts, losses, accuracies, FLOPs")
ARRAYS = _key("arrays", ("record",), "model weights, dense or encoded by the codec")
REFUSED = _key("refused", ("record",), "a node's handshake answer when its data cannot be made, with the reason")
REASON = _key("reason", ("refused",), "why a node refused the handshake (one line)")
SECAGG = _key(
    "secagg",
    ("record",),
    "secure aggregation (run-config secagg): a stage's cohort, public keys, encrypted shares, masked vector or "
    "unmasking request and answer (common/secagg/wire.py)",
)
# ----- inside the 'secagg' record (common/secagg/wire.py) --------------------------------------------------------
SA_CLIENTS = _key("clients", ("secagg",), "SecAgg+ stage 0: the round's cohort size")
SA_SHARES = _key("shares", ("secagg",), "SecAgg+ stage 0: the shares each client makes (its neighbours, itself in)")
SA_THRESHOLD = _key("threshold", ("secagg",), "SecAgg+ stage 0: the shares that rebuild a secret")
SA_IDS = _key("ids", ("secagg",), "SecAgg+: the partitions the paired list of keys, ciphertexts or shares belongs to")
SA_PK1 = _key("pk1", ("secagg",), "SecAgg+: a client's public key for its pairwise masks")
SA_PK2 = _key("pk2", ("secagg",), "SecAgg+: a client's public key for the channel its shares travel on")
SA_CIPHERTEXTS = _key("ciphertexts", ("secagg",), "SecAgg+ stage 2: the encrypted shares addressed to the client")
SA_NAMES = _key("names", ("secagg",), "SecAgg+ stage 2: the arrays the masked upload holds, in order")
SA_SIZES = _key("sizes", ("secagg",), "SecAgg+ stage 2: their sizes")
SA_MASKED = _key(
    "masked", ("secagg",), "SecAgg+ stage 2: the arrays uploaded on the client's own mask (per-position weights, votes)"
)
SA_VALUES = _key(
    "values", ("secagg",), "SecAgg+: a client's ciphertexts (stage 1) or shares (stage 3), paired with ids"
)
SA_SURVIVORS = _key("survivors", ("secagg",), "SecAgg+ stage 3: the neighbours whose vectors are in the sum")
SA_DROPPED = _key("dropped", ("secagg",), "SecAgg+ stage 3: the neighbours that shared their keys, then dropped")
SA_ROUND = _key("round", ("secagg",), "the client's stored SecAgg+ session: the round it belongs to")
GLOBAL_MODEL = _key(
    "global",
    ("record",),
    "sparse algorithms: the global model (weights and mask, by the codec), sent only to a client whose copy is stale",
)
CHANNEL_MASKS = _key("masks", ("record",), "DapperFL: which output channels of each layer group a client kept")
CONTROL = _key(
    "control",
    ("record",),
    "SCAFFOLD: the server's control variate c (to a client), a client's change of its own c_i (to the server), one "
    "array per trainable parameter",
)
FEATURE_MEAN = _key(
    "feature-mean",
    ("record",),
    "FedDBE: a client's mean representation after its round-0 training (to the server), the clients' global mean "
    "(to a client), one array `mean` of the feature extractor's output size",
)
NEWCOMER_MODEL = _key(
    "newcomer",
    ("record", "config"),
    "a held-out client's model (record); in the config: evaluate as a newcomer that never trained",
)

# ----- instructions (server -> client) -------------------------------------------------------------------------
SERVER_ROUND = _key("server-round", ("config",), "the round the message belongs to; the reply names it back")
PARTITION_ID = _key(
    "partition-id",
    ("config", "metrics", "node"),
    "the partition (client) the message is for; in "
    "the handshake, the one a node claims; a SuperNode is started with it",
)
STATE_DIR = _key("state-dir", ("node",), "a device's folder for its client state (survives restarts)")
DP_NOISE_FLOOR = _key(
    "dp-noise-floor",
    ("node",),
    "a device's least local-DP noise: it takes part only in runs with dp = local, a noise multiplier at least this "
    "and noise the server cannot draw again (dp-noise-seed 0)",
)
NUM_PARTITIONS = _key("num-partitions", ("metrics", "node"), "how many partitions the data set is split into")
STATE_KEY = _key("state-key", ("config",), "names the run's client state folders (the run folder's name)")
RUN_ID = _key(
    "run-id",
    ("config",),
    "the run's random id, made at its start: a device's state folder and every state file's signature name it, so "
    "two runs of one name never share client state",
)
CHECKPOINT_ROUND = _key(
    "checkpoint-round", ("config",), "the server's last checkpointed round: client state a resume may need is kept"
)
STATE_ROUND = _key(
    "state-round",
    ("metrics",),
    "the round of the newest client state the client holds after the message (-1: none); the server keeps it and "
    "names it back in the next message (expect-state)",
)
EXPECT_STATE = _key(
    "expect-state",
    ("config",),
    "the round of the newest client state the server knows the client holds: a client whose newest state is older "
    "or missing (a file deleted, an older copy of the folder put back) refuses the message",
)
FRESH_STATE = _key(
    "fresh-state",
    ("config",),
    "the operator let this client start afresh (pflower allow-takeover --fresh-state): it sets aside the state it "
    "holds of the run and starts from none",
)
SIMULATE_DROP = _key("simulate-drop", ("config",), "simulation (drop-rate): fail this round")
PROX_MU = _key("prox-mu", ("config",), "the proximal coefficient of the round (FedProx, FedAMP's lambda / alpha_k)")
PRETRAIN = _key("pretrain", ("config",), "FedAMP, FedDBE: train from the common initialization (round 0)")
PHASE = _key("phase", ("config",), "DM-PFL: the phase of the round (1, 2 or 3); the reply names it back")
PHASE3_RESET = _key(
    "phase3-reset", ("config",), "DM-PFL: reset the personal-only weights to 0 before this phase 3 (Alg. 3, line 3)"
)
LR_STEP = _key(
    "lr-step", ("config",), "lr-decay-step client: the local training calls the client had before this message"
)
READJUST_RATIO = _key("readjust-ratio", ("config",), "DM-PFL, FedDST: the fraction of weights pruned and regrown")
GLOBAL_VERSION = _key("global-version", ("config",), "sparse algorithms: the version of the global model sent or held")
PERSONAL_MASK_DIGEST = _key(
    "personal-mask-digest", ("config",), "DM-PFL: the digest of the personal mask a partial global model was cut for"
)
TOTAL_SAMPLES = _key("total-samples", ("config",), "FLIU: the training samples of all clients (n of Eq. 4)")
NUM_CLIENTS = _key("num-clients", ("config",), "FLIU: the number of clients (K of Eq. 4)")
PEER_IDS = _key("peer-ids", ("config",), "FedFomo: the partitions whose models the message carries")
FINETUNE_EPOCHS = _key("finetune-epochs", ("config",), "a newcomer's local fine-tuning epochs before evaluating")

# ----- reports (client -> server) ------------------------------------------------------------------------------
NUM_TRAIN = _key("num-train", ("metrics",), "handshake: the training samples the client holds (bounds its replies)")
NUM_TEST = _key("num-test", ("metrics",), "test samples held (handshake) or evaluated (evaluation reply)")
NUM_EXAMPLES = _key("num-examples", ("metrics",), "training samples of the round (at most num-train)")
TRAIN_LOSS = _key("train-loss", ("metrics",), "mean training loss of the round")
TRAIN_FLOPS = _key("train-flops", ("metrics",), "training FLOPs of the round (a cost figure, never used in math)")
TRAIN_FLOPS_DENSE_GRAD = _key(
    "train-flops-dense-grad",
    ("metrics",),
    "training FLOPs with whole weight gradients of masked layers; sent only where it differs from train-flops",
)
STEPS = _key("steps", ("metrics",), "optimizer steps of the round")
LOSS = _key("loss", ("metrics",), "evaluation loss")
DOMAIN_ID = _key("domain-id", ("metrics",), "multi-domain data: the client's domain")
DOMAIN_ACC = _key("domain-acc", ("metrics",), "multi-domain data: the global model's accuracy on that domain")
