"""Client state kept across rounds (personal weights, masks, algorithm state): in memory, or in a state dir on disk."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from common.persist import StateFileError, load_tree, save_tree, signing_context, signing_key


class ClientState:
    """Named lists of arrays stored in a Flower RecordDict that stays on the device; `dirty` once changed."""

    def __init__(self, record: RecordDict) -> None:
        self.record = record
        self.dirty = False

    def load_arrays(self, key: str) -> list[np.ndarray] | None:
        """The arrays saved under `key`, or None if never saved."""
        stored = self.record.array_records.get(key)
        return None if stored is None else stored.to_numpy_ndarrays()

    def save_arrays(self, key: str, arrays: list[np.ndarray]) -> None:
        """Replace the arrays saved under `key`."""
        self.record[key] = ArrayRecord([np.require(a, requirements="C") for a in arrays])
        self.dirty = True

    def load_named(self, key: str) -> dict[str, np.ndarray] | None:
        """The named arrays saved under `key`, or None if never saved."""
        stored = self.record.array_records.get(key)
        return None if stored is None else {name: array.numpy() for name, array in stored.items()}

    def save_named(self, key: str, arrays: dict[str, np.ndarray]) -> None:
        """Replace the named arrays saved under `key` (any dtype: weights, bool masks, counters)."""
        self.record[key] = ArrayRecord({name: Array(np.require(a, requirements="C")) for name, a in arrays.items()})
        self.dirty = True


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

    def __init__(self, path: Path, *, run: str, partition: int, key_file: Path | None = None) -> None:
        self.path = Path(path)
        self.run = run
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
        """What the signature of round `server_round`'s file binds it to, so a copy elsewhere or a rename is refused."""
        return signing_context("client-state", self.run, self.partition, server_round)

    def load(self, server_round: int, training: bool) -> tuple[int, RecordDict] | None:
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
            raise StateFileError(f"{path}: refused: cannot be verified: {exc}") from None
        tree = load_tree(path, key=secret, context=self._context(versions[-1]))
        try:
            record = RecordDict(
                {
                    key: ArrayRecord({name: Array(np.asarray(a)) for name, a in arrays.items()})
                    for key, arrays in tree.items()
                }
            )
        except (AttributeError, TypeError, ValueError) as exc:
            raise StateFileError(f"{path}: refused: damaged ({type(exc).__name__}: {exc})") from None
        return versions[-1], record

    def save(self, server_round: int, record: RecordDict, checkpoint_round: int | None) -> None:
        """Write the state of `server_round` atomically and drop versions no resume can need."""
        self.path.mkdir(parents=True, exist_ok=True)
        tree = {
            key: {name: array.numpy() for name, array in arrays.items()} for key, arrays in record.array_records.items()
        }
        save_tree(self._file(server_round), tree, key=signing_key(self.key_file), context=self._context(server_round))
        older = [v for v in self.versions() if v < server_round]
        if checkpoint_round is None:
            keep = set()
        else:
            at_or_before = [v for v in older if v <= checkpoint_round]
            keep = {v for v in older if v > checkpoint_round} | set(at_or_before[-1:])
        for version in older:
            if version not in keep:
                self._file(version).unlink(missing_ok=True)
