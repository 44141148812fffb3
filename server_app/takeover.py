"""Who may let a partition change hands (a replaced device): by default only the operator, by listing the partition
and the one node that may take it in the run folder's `takeover-allowed` file with `pflower allow-takeover RUN_DIR
PARTITION --node NODE`; each listing lets one take-over happen and is then struck out. A consent always names its
node: one for "any node" would go to whichever registered node asks first (an attacker holding one device's key
asks every round). Run-config
`takeover = "after-timeout"` restores the unattended rule (any registered node, once the holder has been gone
`takeover-after` seconds).

The file is trusted only when it is a regular file (never a link) owned by the server's user (or root) and
writable by no one else; it is read and rewritten under a lock, and replaced atomically, so a consent is used once
even when the operator adds one while the server strikes another out. Anything unreadable counts as no consent,
with a warning, never as an error of the run."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from logging import WARNING
from pathlib import Path

from flwr.supercore import log

from common.storage.run_lock import ForeignLockFile, open_locked

CONSENT_FILE = "takeover-allowed"
FRESH_STATE_FILE = "fresh-state-allowed"  # `pflower allow-takeover --fresh-state`: a holder may go on without its state
Grant = tuple[int, int]  # (partition, the node that may take it)


class ConsentError(OSError):
    """The consent file cannot be trusted or read; the message says why."""


class OperatorConsent:
    """Take-overs the operator allowed in `run_dir/takeover-allowed`, each used once; without a folder, none."""

    def __init__(self, run_dir: Path | None = None, name: str = CONSENT_FILE) -> None:
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.name = name

    def allows(self, partition_id: int, node_id: int) -> bool:
        """True (and the consent struck out) when the operator allowed this node to take it."""
        if self.run_dir is None or not os.path.lexists(self.run_dir / self.name):  # no lock taken for no file
            return False
        try:
            with _locked(self.run_dir, self.name):
                grants = read_grants(self.run_dir, self.name)
                if (partition_id, node_id) not in grants:
                    return False
                grants.remove((partition_id, node_id))
                write_grants(self.run_dir, grants, self.name)
                return True
        except (ConsentError, OSError) as exc:
            log(WARNING, "%s consent not used: %s", "take-over" if self.name == CONSENT_FILE else "fresh-state", exc)
            return False

    def how(self, partition_id: int, node_id: int) -> str:
        """What the operator runs to allow it."""
        where = self.run_dir if self.run_dir is not None else "RUN_DIR"
        fresh = " --fresh-state" if self.name == FRESH_STATE_FILE else ""
        return f"the operator's consent: pflower allow-takeover {where} {partition_id} --node {node_id}{fresh}"


class AfterTimeout:
    """run-config takeover = 'after-timeout': no consent needed."""

    def allows(self, partition_id: int, node_id: int) -> bool:
        """Always."""
        return True

    def how(self, partition_id: int, node_id: int) -> str:
        """Nothing to do."""
        return "nothing more"


LOCK_TIMEOUT_S = 10.0  # how long the server or `pflower allow-takeover` waits for the consent file's lock


@contextlib.contextmanager
def _locked(run_dir: Path, name: str = CONSENT_FILE, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """An exclusive lock on the run folder's consent file: a lock file beside it, never followed as a link, refused
    unless it is a regular file of this user's (another user's file could be held forever), taken without blocking
    for at most `timeout` seconds (ConsentError after)."""
    path = run_dir / f".{name}.lock"
    try:
        fd, held = open_locked(path, timeout)
    except ForeignLockFile as exc:
        raise ConsentError(str(exc)) from None
    except OSError as exc:
        raise ConsentError(f"{path} cannot be opened ({exc.strerror}; a link is refused)") from None
    try:
        if not held:
            raise ConsentError(f"{path} stayed locked by another process for {timeout:g} s")
        yield
    finally:
        os.close(fd)


def read_grants(run_dir: Path, name: str = CONSENT_FILE) -> list[Grant]:
    """The consents in the file (none when it is absent; a line that is not two plain ids is ignored); ConsentError
    when it cannot be trusted."""
    try:
        fd = os.open(run_dir / name, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ConsentError(f"{run_dir / name} cannot be opened ({exc.strerror}; a link is refused)") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid not in (os.getuid(), 0) or info.st_mode & 0o022:
            raise ConsentError(
                f"{run_dir / name} is not a regular file owned by this user (or root) and writable by it alone: ignored"
            )
        text = handle.read(1 << 16).decode("ascii", errors="replace")
    grants: list[Grant] = []
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and all(w.isascii() and w.isdigit() and len(w) <= 20 for w in words):
            grants.append((int(words[0]), int(words[1])))
    return grants


def write_grants(run_dir: Path, grants: list[Grant], name: str = CONSENT_FILE) -> None:
    """Replace the file with these consents, atomically (a new file, mode 0600, renamed over the old)."""
    text = "".join(f"{pid} {node}\n" for pid, node in grants)
    temporary = run_dir / f".{name}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(temporary, run_dir / name)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def allow(run_dir: Path, partition_ids: list[int], node_id: int, name: str = CONSENT_FILE) -> Path:
    """Add consents for `node_id` to a run folder's file `name` (the `pflower allow-takeover` command, and with
    --fresh-state FRESH_STATE_FILE); the file's path."""
    with _locked(run_dir, name):
        grants = read_grants(run_dir, name)
        write_grants(run_dir, [*grants, *((pid, node_id) for pid in partition_ids)], name)
    return run_dir / name
