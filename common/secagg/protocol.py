"""SecAgg+ (Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead", CCS 2020) as two
state machines on bytes and uint64 vectors: `ClientSession` (one client, one round) and `ServerSession`.

Stages, as in Flower's `secaggplus_mod` / `SecAggPlusWorkflow`: advertise two public keys; share keys (Shamir
shares of the self-mask seed b and of the mask key sk1, each encrypted for one neighbour); collect masked vectors
(x + PRG(b) + sum over neighbours of +-PRG(agreed key)); unmask (the survivors give b's shares of the survivors
and sk1's shares of those that dropped after sharing). Built from Flower's primitives (key pairs, ECDH + HKDF,
Fernet, Shamir) and the `cryptography` package. Where this differs from Flower 1.42, and why:
- the masks come from ChaCha20 keyed with SHA-256 of the seed (`mask`), where Flower's `pseudo_rand_gen` folds the
  seed to 32 bits for NumPy's RandomState: a server could search all 2**32 self-mask seeds;
- a client refuses an unmask request that names one neighbour both as a survivor and as dropped, names itself as
  dropped, names a node it holds no share of, or comes a second time in a round (Flower's client answers any).
The server is honest but curious about the vectors, and relays the public keys: a server that substitutes keys
(no PKI between the devices) is outside this model, as in the paper's semi-honest setting."""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from cryptography.fernet import InvalidToken
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import decrypt, encrypt, generate_shared_key
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_concat, share_keys_plaintext_separate
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
)

from .encoding import reduce
from .params import Cohort

STAGES = ("advertise", "share_keys", "masked", "unmask")
SEED_BYTES = 32


class SecAggRefused(ValueError):
    """A client's refusal of a request that would break the protocol's guarantee (or that it cannot serve)."""


class SecAggAborted(RuntimeError):
    """The round's secure aggregation cannot finish (too few clients left at some stage)."""


def mask(seed: bytes, size: int, modulus: int) -> np.ndarray:
    """`size` uniform integers in [0, modulus) (a power of two) from ChaCha20 keyed by SHA-256(seed)."""
    key = hashlib.sha256(b"pflower-secagg-mask\x00" + seed).digest()
    stream = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor().update(bytes(8 * size))
    return reduce(np.frombuffer(stream, dtype="<u8").astype(np.uint64), modulus)


def pairwise_key(own_private: bytes, other_public: bytes) -> bytes:
    """The key two clients agree on (ECDH + HKDF, Flower's), the seed of their pairwise mask."""
    return generate_shared_key(bytes_to_private_key(own_private), bytes_to_public_key(other_public))


def ring_neighbours(node_ids: Sequence[int], shares: int, rng: random.Random) -> dict[int, frozenset[int]]:
    """Each node's neighbourhood (itself and shares // 2 on each side) on a ring of the nodes in a seeded order,
    the graph Flower's workflow uses; every node when shares reaches the cohort."""
    order = list(node_ids)
    rng.shuffle(order)
    n, half = len(order), shares // 2
    if shares >= n:
        return {nid: frozenset(order) for nid in order}
    return {nid: frozenset(order[(i + k) % n] for k in range(-half, half + 1)) for i, nid in enumerate(order)}


class ClientSession:
    """One client's side of one round; each stage's method is called once, in order, or it refuses."""

    def __init__(self, node_id: int, cohort: Cohort) -> None:
        self.node_id, self.cohort = node_id, cohort
        self._next = 0
        sk1, pk1 = generate_key_pairs()
        sk2, pk2 = generate_key_pairs()
        self._sk1, self.pk1 = private_key_to_bytes(sk1), public_key_to_bytes(pk1)
        self._sk2, self.pk2 = private_key_to_bytes(sk2), public_key_to_bytes(pk2)
        self._seed = b""
        self._keys: dict[int, tuple[bytes, bytes]] = {}
        self._channel: dict[int, bytes] = {}  # neighbour -> Fernet key (from sk2, pk2)
        self._seed_shares: dict[int, bytes] = {}  # owner -> its b's share held here
        self._key_shares: dict[int, bytes] = {}  # owner -> its sk1's share held here

    def state(self) -> dict[str, int | bytes | list[int] | list[bytes]]:
        """The session as flat values a Flower ConfigRecord holds (the client's context between messages)."""
        out: dict[str, int | bytes | list[int] | list[bytes]] = {
            "node": self.node_id,
            "clients": self.cohort.num_clients,
            "shares": self.cohort.shares,
            "threshold": self.cohort.threshold,
            "next": self._next,
            "sk1": self._sk1,
            "pk1": self.pk1,
            "sk2": self._sk2,
            "pk2": self.pk2,
            "seed": self._seed,
            "keys-ids": list(self._keys),
            "keys-pk1": [pair[0] for pair in self._keys.values()],
            "keys-pk2": [pair[1] for pair in self._keys.values()],
            "channel-ids": list(self._channel),
            "channel": list(self._channel.values()),
            "seed-shares-ids": list(self._seed_shares),
            "seed-shares": list(self._seed_shares.values()),
            "key-shares-ids": list(self._key_shares),
            "key-shares": list(self._key_shares.values()),
        }
        return out

    @classmethod
    def restore(cls, state: Mapping[str, object], cohort: Cohort) -> ClientSession:
        """The session `state()` gave, for the round's `cohort` (ValueError when it is not that cohort's)."""
        if (state.get("clients"), state.get("shares"), state.get("threshold")) != (
            cohort.num_clients,
            cohort.shares,
            cohort.threshold,
        ):
            raise ValueError("the stored secure-aggregation session is of another round's cohort")
        session = cls.__new__(cls)
        session.node_id, session.cohort = int(state["node"]), cohort  # type: ignore[call-overload]
        session._next = int(state["next"])  # type: ignore[call-overload]
        session._sk1, session.pk1 = bytes(state["sk1"]), bytes(state["pk1"])  # type: ignore[call-overload]
        session._sk2, session.pk2 = bytes(state["sk2"]), bytes(state["pk2"])  # type: ignore[call-overload]
        session._seed = bytes(state["seed"])  # type: ignore[call-overload]

        def table(ids: str, values: str) -> dict[int, bytes]:
            return dict(zip(state.get(ids, []), state.get(values, []), strict=True))  # type: ignore[call-overload]

        firsts, seconds = table("keys-ids", "keys-pk1"), table("keys-ids", "keys-pk2")
        session._keys = {nid: (firsts[nid], seconds[nid]) for nid in firsts}
        session._channel = table("channel-ids", "channel")
        session._seed_shares = table("seed-shares-ids", "seed-shares")
        session._key_shares = table("key-shares-ids", "key-shares")
        return session

    def _stage(self, stage: str) -> None:
        expected = STAGES[self._next] if self._next < len(STAGES) else "none (the round is over)"
        if stage != expected:
            raise SecAggRefused(f"node {self.node_id}: asked for stage {stage!r}, expected {expected!r}")
        self._next += 1

    def advertise(self) -> tuple[bytes, bytes]:
        """Stage 0: the two public keys (pk1 for masks, pk2 for the share channel)."""
        self._stage("advertise")
        return self.pk1, self.pk2

    def share_keys(self, neighbour_keys: Mapping[int, tuple[bytes, bytes]]) -> dict[int, bytes]:
        """Stage 1: given the neighbours' public keys (its own among them), Shamir shares of b and sk1, one
        encrypted ciphertext per other neighbour."""
        self._stage("share_keys")
        cohort = self.cohort
        if neighbour_keys.get(self.node_id) != (self.pk1, self.pk2):
            raise SecAggRefused(f"node {self.node_id}: its own public keys are missing or altered")
        if not cohort.threshold <= len(neighbour_keys) <= cohort.shares:
            raise SecAggRefused(
                f"node {self.node_id}: {len(neighbour_keys)} neighbours, where {cohort.threshold} to {cohort.shares}"
                " are needed"
            )
        flat = [key for pair in neighbour_keys.values() for key in pair]
        if len(set(flat)) != len(flat):
            raise SecAggRefused(f"node {self.node_id}: two neighbours advertised the same public key")
        self._keys = dict(neighbour_keys)
        self._seed = os.urandom(SEED_BYTES)
        order = sorted(neighbour_keys)
        seed_shares = create_shares(self._seed, cohort.threshold, len(order))
        key_shares = create_shares(self._sk1, cohort.threshold, len(order))
        out = {}
        for nid, seed_share, key_share in zip(order, seed_shares, key_shares, strict=True):
            if nid == self.node_id:
                self._seed_shares[nid], self._key_shares[nid] = seed_share, key_share
                continue
            self._channel[nid] = pairwise_key(self._sk2, neighbour_keys[nid][1])
            plaintext = share_keys_plaintext_concat(self.node_id, nid, seed_share, key_share)
            out[nid] = encrypt(self._channel[nid], plaintext)
        return out

    def masked(self, ciphertexts: Mapping[int, bytes], vector: np.ndarray) -> np.ndarray:
        """Stage 2: store the shares the neighbours sent, then the vector masked with PRG(b) and the pairwise
        masks of those neighbours (+ toward a smaller node id, - toward a larger), modulo the modulus."""
        self._stage("masked")
        cohort = self.cohort
        for src, ciphertext in ciphertexts.items():
            if src not in self._channel:
                raise SecAggRefused(f"node {self.node_id}: shares from {src}, which is not a neighbour")
            try:
                sender, receiver, seed_share, key_share = share_keys_plaintext_separate(
                    decrypt(self._channel[src], ciphertext)
                )
            except (InvalidToken, ValueError, TypeError) as error:
                raise SecAggRefused(f"node {self.node_id}: the shares from {src} do not open") from error
            if (sender, receiver) != (src, self.node_id):
                raise SecAggRefused(f"node {self.node_id}: shares from {sender} for {receiver} arrived as {src}'s")
            self._seed_shares[src], self._key_shares[src] = seed_share, key_share
        if len(ciphertexts) + 1 < cohort.threshold:
            raise SecAggRefused(f"node {self.node_id}: shares from {len(ciphertexts)} neighbours, too few")
        modulus = cohort.params.modulus_range
        vector = np.asarray(vector, np.uint64)
        if vector.size and int(vector.max()) >= modulus:
            raise SecAggRefused(f"node {self.node_id}: the vector holds values of the modulus or more")
        out = vector + mask(self._seed, vector.size, modulus)
        for other in ciphertexts:
            pairwise = mask(pairwise_key(self._sk1, self._keys[other][0]), vector.size, modulus)
            out = out + pairwise if self.node_id > other else out - pairwise
        return reduce(out, modulus)

    def unmask(self, survivors: Iterable[int], dropped: Iterable[int]) -> dict[int, bytes]:
        """Stage 3: b's share of each survivor, sk1's share of each dropped neighbour; never both for one."""
        self._stage("unmask")
        alive, gone = list(survivors), list(dropped)
        if len(set(alive)) != len(alive) or len(set(gone)) != len(gone) or set(alive) & set(gone):
            raise SecAggRefused(f"node {self.node_id}: a neighbour is named twice (both secrets of one client)")
        if self.node_id not in alive:
            raise SecAggRefused(f"node {self.node_id}: its own masked vector was sent; it cannot be a dropout")
        unknown = (set(alive) | set(gone)) - set(self._seed_shares)
        if unknown:
            raise SecAggRefused(f"node {self.node_id}: holds no share of {sorted(unknown)}")
        if len(alive) < self.cohort.threshold:
            raise SecAggRefused(f"node {self.node_id}: {len(alive)} survivors, fewer than the threshold")
        shares = {nid: self._seed_shares[nid] for nid in alive}
        shares.update({nid: self._key_shares[nid] for nid in gone})
        return shares


class ServerSession:
    """The server's side of one round: routes keys and shares between neighbours, sums the masked vectors and
    removes the masks; it never holds an unmasked vector of one client. Replies that break the protocol are left
    out (as dropouts) with a line in `rejected`; too few clients left raises SecAggAborted."""

    def __init__(self, cohort: Cohort, node_ids: Sequence[int], vector_size: int, rng: random.Random) -> None:
        if len(set(node_ids)) != len(node_ids) or len(node_ids) != cohort.num_clients:
            raise ValueError(f"{len(node_ids)} node ids for a cohort of {cohort.num_clients}, or a repeated id")
        self.cohort, self.vector_size = cohort, vector_size
        self.neighbours = ring_neighbours(node_ids, cohort.shares, rng)
        self.keys: dict[int, tuple[bytes, bytes]] = {}
        self.shared: set[int] = set()  # sent their shares: their neighbours mask with them
        self.survivors: set[int] = set()  # their masked vectors are in the sum
        self.total = np.zeros(vector_size, np.uint64)
        self.rejected: list[str] = []

    def _require(self, stage: str, alive: set[int]) -> None:
        threshold = self.cohort.threshold
        short = sorted(nid for nid in alive if len(self.neighbours[nid] & alive) < threshold)
        if len(alive) < threshold or short:
            raise SecAggAborted(
                f"secure aggregation stopped at {stage}: {len(alive)} clients left"
                + (f", {len(short)} of them with fewer than {threshold} neighbours left" if short else "")
                + f" (threshold {threshold})"
            )

    def _reject(self, nid: int, why: str) -> None:
        self.rejected.append(f"node {nid}: {why}")

    def share_requests(self, keys: Mapping[int, tuple[bytes, bytes]]) -> dict[int, dict[int, tuple[bytes, bytes]]]:
        """After stage 0: per client, its neighbours' public keys (those that advertised)."""
        seen: dict[bytes, int] = {}
        for nid, pair in keys.items():
            if nid not in self.neighbours or not (isinstance(pair, tuple) and len(pair) == 2):
                self._reject(nid, "public keys from a node outside the round, or not a pair")
                continue
            if any(key in seen or not isinstance(key, bytes) for key in pair) or pair[0] == pair[1]:
                self._reject(nid, "a public key repeated or malformed")
                continue
            seen.update({key: nid for key in pair})
            self.keys[nid] = pair
        alive = set(self.keys)
        self._require("the key advertisement", alive)
        return {nid: {m: self.keys[m] for m in self.neighbours[nid] & alive} for nid in alive}

    def masked_requests(self, ciphertexts: Mapping[int, Mapping[int, bytes]]) -> dict[int, dict[int, bytes]]:
        """After stage 1: per client, the ciphertexts its neighbours addressed to it. A client must address every
        neighbour that advertised (else the pairwise masks would not cancel)."""
        for src, sent in ciphertexts.items():
            expected = (self.neighbours.get(src, frozenset()) & set(self.keys)) - {src}
            if src not in self.keys or set(sent) != expected:
                self._reject(src, "shares not addressed to exactly its neighbours")
                continue
            if not all(isinstance(c, bytes) for c in sent.values()):
                self._reject(src, "shares that are not bytes")
                continue
            self.shared.add(src)
        self._require("the key sharing", self.shared)
        return {
            nid: {src: ciphertexts[src][nid] for src in (self.neighbours[nid] & self.shared) - {nid}}
            for nid in self.shared
        }

    def unmask_requests(self, vectors: Mapping[int, np.ndarray]) -> dict[int, tuple[list[int], list[int]]]:
        """After stage 2: the sum of the masked vectors; per survivor, which neighbours survived and which dropped
        after sharing."""
        modulus = self.cohort.params.modulus_range
        for nid, vector in vectors.items():
            if nid not in self.shared:
                self._reject(nid, "a masked vector from a node that did not share its keys")
            elif not isinstance(vector, np.ndarray) or vector.dtype != np.uint64 or vector.shape != self.total.shape:
                self._reject(nid, f"a masked vector that is not {self.vector_size} uint64 values")
            elif vector.size and int(vector.max()) >= modulus:
                self._reject(nid, "a masked vector with values of the modulus or more")
            else:
                self.survivors.add(nid)
                self.total += vector
        self._require("the masked vectors", self.survivors)
        return self._requests()

    def finish(self, replies: Mapping[int, Mapping[int, bytes]]) -> np.ndarray:
        """After stage 3: rebuild each survivor's b and each dropout's sk1 from threshold shares, remove the
        masks; the sum of the survivors' vectors modulo the modulus."""
        requests = {nid: (set(a), set(d)) for nid, (a, d) in self._requests().items()}
        collected: dict[int, list[bytes]] = {}
        for responder, shares in replies.items():
            if responder not in requests or set(shares) != requests[responder][0] | requests[responder][1]:
                self._reject(responder, "unmask shares not for exactly the nodes asked")
                continue
            for owner, share in shares.items():
                collected.setdefault(owner, []).append(share)
        threshold, modulus = self.cohort.threshold, self.cohort.params.modulus_range
        total = self.total.copy()
        for owner in sorted(self.shared):
            owned = collected.get(owner, [])
            if len(owned) < threshold:
                raise SecAggAborted(
                    f"secure aggregation stopped at the unmasking: {len(owned)} shares of node {owner}'s secret, "
                    f"{threshold} needed"
                )
            try:
                secret = combine_shares(owned)
                if owner in self.survivors:
                    total -= mask(secret, self.vector_size, modulus)
                    continue
                for other in sorted((self.neighbours[owner] & self.survivors) - {owner}):
                    pairwise = mask(pairwise_key(secret, self.keys[other][0]), self.vector_size, modulus)
                    total = total - pairwise if other > owner else total + pairwise
            except (ValueError, TypeError) as error:
                raise SecAggAborted(f"secure aggregation stopped: node {owner}'s secret does not rebuild") from error
        return reduce(total, modulus)

    def _requests(self) -> dict[int, tuple[list[int], list[int]]]:
        gone = self.shared - self.survivors
        return {
            nid: (sorted(self.neighbours[nid] & self.survivors), sorted(self.neighbours[nid] & gone))
            for nid in self.survivors
        }
