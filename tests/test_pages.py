"""New memory-mapped stores: disk space reserved up front, a full disk a clear error."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from common.methods.attention import ModelMatrix
from common.methods.dmpfl import PersonalMaskStore
from common.storage import pages
from common.storage.pages import StoreSpaceError, new_store


def test_a_new_store_has_its_disk_space_reserved(tmp_path: Path) -> None:
    """Every page of a new store is allocated on disk up front (a sparse file would die of SIGBUS at the first write
    the full disk cannot back), and reads as zeros."""
    store = new_store(tmp_path / "store.npy", np.float32, (50, 10_000))
    size = os.path.getsize(tmp_path / "store.npy")
    assert os.stat(tmp_path / "store.npy").st_blocks * 512 >= size
    assert store.shape == (50, 10_000) and not store.any()


@pytest.mark.parametrize(
    "make",
    [
        lambda path: ModelMatrix(4, np.zeros(1000, np.float32), True, path),
        lambda path: PersonalMaskStore([1, 2], {"w": (64,)}, path).put(1, {"w": np.ones(64, bool)}),
    ],
)
def test_a_full_disk_is_a_clear_error_and_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make) -> None:
    """FedAMP's model store and DM-PFL's mask store on a full disk: a StoreSpaceError naming the file, no file."""

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pages.os, "posix_fallocate", full)
    with pytest.raises(StoreSpaceError, match=r"cannot reserve .* MB on disk for .*store\.npy \(No space left"):
        make(tmp_path / "store.npy")
    assert not (tmp_path / "store.npy").exists()
