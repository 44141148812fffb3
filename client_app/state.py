"""Client state kept across rounds (personal weights, masks, algorithm state): in memory, or in a state dir on disk."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from logging import DEBUG, INFO
from pathlib import Path
from typing import Protocol

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.supercore import log

from common.storage.persist import (
    StateFileError,
    load_tree,
    private_folder,
    save_tree,
    signing_context,
    signing_key,
)

Tree = dict[str, dict[str, np.ndarray]]  # state key -> array name -> array (a list is kept as names "0", "1", ...)


def immutable_root(array: np.ndarray) -> bytes | None:
    """The bytes object an array is a read-only view of (what a received payload decodes to: no one can ever change
    it, numpy refuses to make such a view writable), or None for an array that may change."""
    base: object = array
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return None
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return base if type(base) is bytes else None


class ClientState:
    """Named arrays a client keeps across rounds, as a plain tree of numpy arrays; `dirty` once changed. Saving
    copies the arrays (except views of immutable bytes, which cannot change: a received global model is kept as
    it came, and the in-process engine lets the clients that keep the same one share it) and loading gives
    read-only views of them, so what is kept cannot change behind its back."""

    def __init__(self, tree: Tree | None = None, version: int | None = None) -> None:
        self.tree: Tree = {} if tree is None else tree
        self.changed: set[str] = set()  # keys saved or forgotten since the state was made
        self.version = version  # the round of the stored state it was restored from (None: none, or not known)

    @property
    def dirty(self) -> bool:
        """Whether anything changed."""
        return bool(self.changed)

    @classmethod
    def from_record(cls, record: RecordDict) -> ClientState:
        """The state held in a Flower RecordDict (a node context's state)."""
        return cls(
            {key: {name: a.numpy() for name, a in arrays.items()} for key, arrays in record.array_records.items()}
        )

    @property
    def record(self) -> RecordDict:
        """The state as a Flower RecordDict (what a node's context holds)."""
        return RecordDict({key: self.array_record(key) for key in self.tree})

    def array_record(self, key: str) -> ArrayRecord:
        """The arrays under `key` as a Flower ArrayRecord."""
        return ArrayRecord({name: Array(np.require(a, requirements="C")) for name, a in self.tree[key].items()})

    def write_to(self, record: RecordDict) -> None:
        """Bring a node context's state up to date with what changed here."""
        for key in self.changed:
            if key in self.tree:
                record[key] = self.array_record(key)
            elif key in record:
                del record[key]

    def load_arrays(self, key: str) -> list[np.ndarray] | None:
        """The arrays saved under `key`, or None if never saved."""
        stored = self.tree.get(key)
        return None if stored is None else [_read_only(stored[str(i)]) for i in range(len(stored))]

    def save_arrays(self, key: str, arrays: list[np.ndarray]) -> None:
        """Replace the arrays saved under `key`."""
        self.save_named(key, {str(i): a for i, a in enumerate(arrays)})

    def load_named(self, key: str) -> dict[str, np.ndarray] | None:
        """The named arrays saved under `key`, or None if never saved."""
        stored = self.tree.get(key)
        return None if stored is None else {name: _read_only(a) for name, a in stored.items()}

    def save_named(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        """Replace the named arrays saved under `key` (any dtype: weights, bool masks, counters)."""
        self.tree[key] = {name: _kept_copy(a) for name, a in arrays.items()}
        self.changed.add(key)

    def forget(self, key: str) -> None:
        """Drop what is saved under `key` (nothing if nothing is)."""
        if self.tree.pop(key, None) is not None:
            self.changed.add(key)

    def has(self, key: str) -> bool:
        """Whether anything is saved under `key`."""
        return key in self.tree


def _kept_copy(array: np.ndarray) -> np.ndarray:
    """What saving keeps of an array: itself when it is a C-ordered view of immutable bytes, else a copy."""
    if array.flags.c_contiguous and immutable_root(array) is not None:
        return array
    return np.array(array, order="C", copy=True)


def _read_only(array: np.ndarray) -> np.ndarray:
    """A view of `array` that refuses writes."""
    view = array.view()
    view.flags.writeable = False
    return view


_VERSION = re.compile(r"round-(\d{6})\.npz")
# The key that signs a client's state files, in the folder above its state dir (the run's state folder: a device's
# <state-dir>/<run>/, or the run folder's client-state/), mode 0600: someone who may write the state files but is not
# this user can neither read it nor put their own in its place (signing_key refuses a key of another user's). It
# travels with the state, so a state folder shared by the machines of a cluster verifies on each of them.
KEY_FILE = ".state.key"


class StateDir:
    """One client's state on disk, one file per round it changed (`round-000007.npz`), each written atomically.

    A message of round r reads the newest version of an earlier round (a training message) or of round r at
    most (an evaluation, which follows training). Versions of later rounds belong to a future the server rolled
    back from (it resumed from a checkpoint), so they are deleted. Saving keeps what a resume could need: the
    newest version at or before the server's last checkpoint and every later one. Every file is signed with the key
    in `key_file` (default: KEY_FILE beside the state dir) together with its run (the server's state key), partition
    and round; one whose signature does not match (changed, or moved from another of these) is refused.
    """

    def __init__(self, path: Path, *, run: str, partition: int, key_file: Path | None = None, run_id: str = "") -> None:
        self.path = Path(path)
        self.run = run
        self.run_id = run_id  # the server's random run id ("" from a server of an older version)
        self.partition = partition
        self.key_file = Path(key_file) if key_file is not None else self.path.parent / KEY_FILE

    def versions(self) -> list[int]:
        """Rounds with a stored version, oldest first."""
        if not self.path.is_dir():
            return []
        return sorted(int(m.group(1)) for f in self.path.iterdir() if (m := _VERSION.fullmatch(f.name)))

    def _file(self, server_round: int) -> Path:
        return self.path / f"round-{server_round:06d}.npz"

    def _context(self, server_round: int) -> bytes:
        """What the signature of round `server_round`'s file binds it to (its run's name and id, partition and round),
        so a copy from another run, even one of the same name, another partition or round, or a rename is refused."""
        if self.run_id:
            return signing_context("client-state", self.run, self.run_id, self.partition, server_round)
        return signing_context("client-state", self.run, self.partition, server_round)

    def load(self, server_round: int, training: bool) -> tuple[int, Tree] | None:
        """(round, state) of the newest usable version for a message of `server_round`; None if there is none.
        StateFileError naming the file when that version fails to load (changed, unsigned, damaged): the client
        must not go on from an older or a fresh state as if nothing had happened."""
        limit = server_round if training else server_round + 1
        for stale in [v for v in self.versions() if v >= limit]:
            self._file(stale).unlink(missing_ok=True)
        versions = self.versions()
        if not versions:
            return None
        path = self._file(versions[-1])
        try:
            secret = signing_key(self.key_file, create=False)
        except StateFileError as exc:
            raise StateFileError(
                f"{path}: refused: cannot be verified: {exc}. Put the key back from a backup, or delete {self.path} to "
                "start this client afresh (it loses what it learned)"
            ) from None
        tree = load_tree(path, key=secret, context=self._context(versions[-1]))
        if not isinstance(tree, dict) or not all(
            isinstance(arrays, dict) and all(isinstance(a, np.ndarray) for a in arrays.values())
            for arrays in tree.values()
        ):
            raise StateFileError(f"{path}: refused: damaged (not a tree of named arrays)")
        return versions[-1], {str(key): {str(name): a for name, a in arrays.items()} for key, arrays in tree.items()}

    def save(self, server_round: int, tree: Tree, checkpoint_round: int | None, durable: bool = True) -> None:
        """Write the state of `server_round` atomically and drop versions no resume can need; `durable`: on disk
        before this returns (fsync), else once the server's barrier before its next checkpoint has run (a
        simulation's clients: server_app/checkpoint.synced_client_states)."""
        private_folder(self.path)
        save_tree(
            self._file(server_round),
            tree,
            key=signing_key(self.key_file),
            context=self._context(server_round),
            durable=durable,
        )
        older = [v for v in self.versions() if v < server_round]
        if checkpoint_round is None:
            keep = set()
        else:
            at_or_before = [v for v in older if v <= checkpoint_round]
            keep = {v for v in older if v > checkpoint_round} | set(at_or_before[-1:])
        for version in older:
            if version not in keep:
                self._file(version).unlink(missing_ok=True)


@dataclass
class Kept:
    """A client's state as a message left it: the round it belongs to, its arrays, the last checkpoint round the
    message named, where it goes on disk (None: memory only) and whether it changed since it was last on disk."""

    server_round: int
    tree: Tree
    checkpoint_round: int | None
    store: StateDir | None
    dirty: bool


class StateHost:
    """Where a runtime other than Flower's keeps client state between messages (the in-process engine's worker): it
    hands the client the state its message came with (`incoming`) and takes what the message left (`outgoing`),
    so the state moves in memory and reaches the state dir only when the runtime writes it (at checkpoints)."""

    def __init__(self) -> None:
        self.incoming: Kept | None = None
        self.outgoing: Kept | None = None

    def begin(self, incoming: Kept | None) -> None:
        """A new message: the state it came with (None: none, or on disk only)."""
        self.incoming, self.outgoing = incoming, None


HOST: StateHost | None = None  # set by a runtime that keeps client state itself; None under Flower's runtimes


def host_state(host: StateHost | None) -> None:
    """Install (or remove, with None) the runtime that keeps client state in this process."""
    global HOST
    HOST = host


class StateStore(Protocol):
    """Where a client's state lives between its messages: what a message starts from and where what it left goes."""

    @property
    def checks_versions(self) -> bool:
        """Whether the store can tell a missing or older version (on disk) from none kept."""
        ...

    def restore(self, server_round: int, training: bool) -> ClientState:
        """The state a message of `server_round` starts from (a training message reads an earlier round's)."""
        ...

    def persist(self, state: ClientState, server_round: int, checkpoint_round: int | None, due: bool) -> None:
        """Keep what the message left (`due`: the server writes a checkpoint after this round)."""
        ...


_restored: set[Path] = set()  # state dirs this process has restored from, so the restore is logged once


def _answers_for_many_clients() -> bool:
    """Whether this process answers for many simulated clients (an engine worker, a Ray actor of Flower's
    simulation), where a restore line per client would bury the round lines; a device's ClientApp answers for one."""
    ray = sys.modules.get("ray")
    return HOST is not None or (ray is not None and ray.is_initialized())


def _load_logged(store: StateDir, server_round: int, training: bool) -> tuple[int, Tree] | None:
    """The state dir's newest usable version for the message, logged the first time this process reads the dir
    (at debug level where the process answers for many clients: the server logs the resume once)."""
    loaded = store.load(server_round, training)
    if loaded is not None and store.path not in _restored:
        _restored.add(store.path)
        level = DEBUG if _answers_for_many_clients() else INFO
        log(level, "client state restored from %s (round %d)", store.path, loaded[0])
    return loaded


@dataclass
class NodeContextStore:
    """The state in the node context Flower keeps (client-state-dir=memory under Flower's runtimes)."""

    record: RecordDict
    checks_versions = False  # memory: a restarted node has none, by design

    def restore(self, server_round: int, training: bool) -> ClientState:
        return ClientState.from_record(self.record)

    def persist(self, state: ClientState, server_round: int, checkpoint_round: int | None, due: bool) -> None:
        state.write_to(self.record)


@dataclass
class StateDirStore:
    """The state in a state dir on disk, one signed file per round it changed (a device, Flower's simulation)."""

    folder: StateDir
    checks_versions = True

    def restore(self, server_round: int, training: bool) -> ClientState:
        loaded = _load_logged(self.folder, server_round, training)
        return ClientState() if loaded is None else ClientState(loaded[1], loaded[0])

    def persist(self, state: ClientState, server_round: int, checkpoint_round: int | None, due: bool) -> None:
        # a device's state is on disk before it replies; a simulation's server makes all of its clients' writes
        # durable at once before each checkpoint (the only point a resume goes back to)
        self.folder.save(server_round, state.tree, checkpoint_round, durable=not _answers_for_many_clients())


@dataclass
class RuntimeStore:
    """The state kept in memory by the runtime hosting the client (the in-process engine), backed by the state
    dir, where there is one, which it reaches at checkpoints."""

    host: StateHost
    folder: StateDir | None

    @property
    def checks_versions(self) -> bool:
        """Whether a state dir backs the memory (a run folder): then a missing version is one deleted."""
        return self.folder is not None

    def restore(self, server_round: int, training: bool) -> ClientState:
        limit = server_round if training else server_round + 1  # a training message reads an earlier round's state
        if self.host.incoming is not None and self.host.incoming.server_round < limit:
            return ClientState(dict(self.host.incoming.tree), self.host.incoming.server_round)
        loaded = None if self.folder is None else _load_logged(self.folder, server_round, training)
        if loaded is None:
            return ClientState()
        self.host.outgoing = Kept(loaded[0], loaded[1], None, self.folder, dirty=False)  # the next needs no read
        return ClientState(loaded[1], loaded[0])

    def persist(self, state: ClientState, server_round: int, checkpoint_round: int | None, due: bool) -> None:
        # in a round the server checkpoints, the state also goes to the state dir now, on this worker
        written = self.folder is not None and due
        if self.folder is not None and due:
            self.folder.save(server_round, state.tree, checkpoint_round, durable=False)  # the server syncs them
        self.host.outgoing = Kept(server_round, state.tree, checkpoint_round, self.folder, dirty=not written)


def pick_store(folder: StateDir | None, context_state: RecordDict) -> StateStore:
    """The one place a client's state store is chosen: the runtime's memory when a runtime hosts the client, else
    its state dir, else Flower's node context."""
    if HOST is not None:
        return RuntimeStore(HOST, folder)
    return StateDirStore(folder) if folder is not None else NodeContextStore(context_state)
