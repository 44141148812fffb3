"""Data files an attacker may plant: CIFAR-10 pickles are decoded from the bytes that were checked, by an unpickler
that admits only numpy arrays; a partition file is size-checked before anything in it is decompressed, and its
indices may not repeat or overlap. Every refusal is one line."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import shlex
import struct
import tracemalloc
import warnings
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from common.data import datasets
from common.data.datasets import DataError, clear_dataset_cache, load_dataset, verify_cifar_file
from common.data.partition_file import read_partition_file

DIGITS = 1797


# ----- CIFAR-10 pickles ------------------------------------------------------------------------------------------
class _Eval:
    """Unpickling this calls builtins.eval, which creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').close()",))


class _System:
    """Unpickling this calls os.system, which creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def _batch(n: int = 4, seed: int = 0) -> dict:
    """A CIFAR-style batch (pickled below with protocol 3, which needs no globals beyond numpy's)."""
    rng = np.random.default_rng(seed)
    return {
        b"batch_label": b"testing batch",
        b"labels": [int(v) for v in rng.integers(0, 10, n)],
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
    }


def _known(monkeypatch, path: Path, data: bytes) -> None:
    """Write `data` to `path` and make its sha256 one the loader accepts (as if the subset's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    monkeypatch.setitem(datasets.CIFAR_SUBSET_SHA256, path.name, hashlib.sha256(data).hexdigest())


def _cifar_folder(monkeypatch, root: Path, first_batch: bytes) -> Path:
    """A cifar-10-batches-py folder of accepted files: `first_batch` as data_batch_1, a good test batch and meta."""
    folder = root / "cifar-10-batches-py"
    _known(monkeypatch, folder / "data_batch_1", first_batch)
    _known(monkeypatch, folder / "test_batch", pickle.dumps(_batch(3, seed=1), protocol=3))
    meta = {b"label_names": [b"c%d" % i for i in range(10)], b"num_cases_per_batch": 4, b"num_vis": 3072}
    _known(monkeypatch, folder / "batches.meta", pickle.dumps(meta, protocol=3))
    return folder


@pytest.mark.parametrize("payload", [_Eval, _System])
@pytest.mark.parametrize("protocol", [2, 3, pickle.HIGHEST_PROTOCOL])
def test_a_checked_pickle_that_calls_a_function_is_refused(tmp_path, monkeypatch, payload, protocol: int) -> None:
    """Even a file whose hash is accepted cannot run code: the unpickler admits only numpy's array globals."""
    marker = tmp_path / "marker"
    evil = pickle.dumps({"data": payload(marker), "labels": [0]}, protocol=protocol)
    folder = _cifar_folder(monkeypatch, tmp_path, evil)
    with pytest.raises(DataError, match=rf"^cifar10: {folder / 'data_batch_1'} refers to '\w+\.(eval|system)', which"):
        load_dataset("cifar10", str(tmp_path))
    assert not marker.exists(), "the planted pickle ran"
    clear_dataset_cache()


def test_a_file_swapped_after_its_check_is_never_decoded(tmp_path, monkeypatch) -> None:
    """The loader decodes the bytes it checked: a file replaced right after the check is not read again."""
    marker = tmp_path / "marker"
    good = _batch(4)
    folder = _cifar_folder(monkeypatch, tmp_path, pickle.dumps(good, protocol=3))
    real_verify = datasets.verify_cifar_file

    def verify_then_swap(path: Path):
        checked = real_verify(path)
        path.write_bytes(pickle.dumps({b"data": _Eval(marker), b"labels": [0]}, protocol=3))
        return checked

    monkeypatch.setattr(datasets, "verify_cifar_file", verify_then_swap)
    data = load_dataset("cifar10", str(tmp_path))
    clear_dataset_cache()
    assert not marker.exists(), "the swapped-in pickle ran"
    assert np.array_equal(data.x[:4], good[b"data"].reshape(-1, 3, 32, 32))
    assert data.y[:4].tolist() == good[b"labels"] and len(data.y) == 7
    assert (folder / "data_batch_1").read_bytes() != pickle.dumps(good, protocol=3)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8)}, protocol=3), "is not a CIFAR-10 batch"),
        (pickle.dumps({b"data": np.zeros((2, 5), np.uint8), b"labels": [0, 1]}, protocol=3), "is not a CIFAR-10"),
        (pickle.dumps({b"data": np.array([1, "x"], dtype=object), b"labels": [0, 1]}), "is not a CIFAR-10 batch"),
        (pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [10]}, protocol=3), "is not a CIFAR-10"),
        (pickle.dumps([1, 2, 3], protocol=3), "is not a CIFAR-10 batch"),
        (pickle.dumps(_batch(2), protocol=3)[:100], "could not be decoded"),
        (b"not a pickle", "could not be decoded"),
        (pickle.dumps(zipfile.ZipInfo("x"), protocol=3), r"refers to 'zipfile\.ZipInfo'"),
    ],
)
def test_a_malformed_batch_is_one_line(tmp_path, content: bytes, message: str) -> None:
    from common.data.readers import decode_cifar_batch

    path = tmp_path / "data_batch_1"
    with pytest.raises(DataError, match=rf"^cifar10: {path} .*{message}") as info:
        decode_cifar_batch(path, content)
    assert "\n" not in str(info.value)


def test_an_unknown_or_missing_file_is_one_line(tmp_path) -> None:
    path = tmp_path / "data_batch_1"
    with pytest.raises(DataError, match=rf"^cifar10: could not read {path}: "):
        verify_cifar_file(path)
    path.write_bytes(pickle.dumps(_batch(2), protocol=3))
    with pytest.raises(DataError, match="refusing to unpickle it$"):
        verify_cifar_file(path)


def test_the_real_cifar_files_decode_as_a_plain_unpickler_would(data_dir) -> None:
    from common.data.readers import decode_cifar_batch

    folder = data_dir / "cifar-10-batches-py"
    if not (folder / "test_batch").is_file():
        pytest.skip(f"CIFAR-10 not staged in {folder}")
    for path in sorted([*folder.glob("data_batch_*"), folder / "test_batch"]):
        checked = verify_cifar_file(path)
        x, y = decode_cifar_batch(path, checked)
        plain = pickle.loads(checked, encoding="bytes")  # the checked bytes of a known file
        assert np.array_equal(x, plain[b"data"].reshape(-1, 3, 32, 32)) and y.tolist() == plain[b"labels"]
        assert x.dtype == np.uint8 and y.dtype == np.int64 and len(y) == 10000


# ----- partition files -------------------------------------------------------------------------------------------
def _npy(values: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, values, allow_pickle=False)
    return buf.getvalue()


def _npz(path: Path, members: dict[str, bytes]) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns on the duplicate names some tests write on purpose
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in members.items():
                zf.writestr(name.split("#")[0], data)
    return path


GOOD = {
    "train_0.npy": _npy(np.array([0, 1, 2])),
    "test_0.npy": _npy(np.array([3])),
    "train_1.npy": _npy(np.array([4, 5])),
    "test_1.npy": _npy(np.array([6])),
}


def _refused(path: Path, message: str, num_clients: int = 2) -> None:
    with pytest.raises(DataError, match=rf"^partition-file {path}: {message}") as info:
        read_partition_file(path, num_clients, DIGITS)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400


def _deflate_bomb(path: Path, count: int) -> Path:
    """A zip (written by hand: zipfile cannot store precompressed data) whose train_0.npy holds `count` int64
    zeros deflated to ~1/1000 of their size, next to a small test_0.npy."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False, "shape": (count,)})
    chunk, reps = 4_000_000, count * 8 // 4_000_000
    assert chunk * reps == count * 8
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    # Full flushes make every block independent, so one compressed chunk of zeros can be repeated.
    head = deflate.compress(header.getvalue()) + deflate.flush(zlib.Z_FULL_FLUSH)
    zeros = deflate.compress(bytes(chunk)) + deflate.flush(zlib.Z_FULL_FLUSH)
    tail = deflate.flush()
    crc = zlib.crc32(header.getvalue())
    for _ in range(reps):
        crc = zlib.crc32(bytes(chunk), crc)
    small = _npy(np.array([5]))
    members = [
        (b"train_0.npy", head + zeros * reps + tail, crc, len(header.getvalue()) + count * 8),
        (b"test_0.npy", zlib.compress(small)[2:-4], zlib.crc32(small), len(small)),
    ]
    local, central = b"", b""
    for name, data, crc_, size in members:
        central += struct.pack(
            "<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, 8, 0, 0, crc_, len(data), size, len(name), 0, 0, 0, 0, 0,
            len(local),
        ) + name  # fmt: skip
        local += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, crc_, len(data), size, len(name), 0)
        local += name + data
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), len(central), len(local), 0)
    path.write_bytes(local + central + end)
    return path


def test_a_zip_bomb_is_refused_before_decompressing(tmp_path) -> None:
    path = _deflate_bomb(tmp_path / "bomb.npz", 10**8)  # 800 MB of int64 zeros
    assert path.stat().st_size < 1_000_000
    with zipfile.ZipFile(path) as zf:  # a well-formed archive: the file sizes are what the zip says
        assert zf.getinfo("train_0.npy").file_size > 8 * 10**8
    tracemalloc.start()
    try:
        _refused(path, r"its train arrays unpack to \d+ bytes, more than the \d+ that 1797 indices .* it$", 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak} bytes allocated while refusing"


def test_a_header_declaring_more_indices_than_the_data_set_is_refused(tmp_path) -> None:
    """A member small on disk whose .npy header claims 1e8 indices: refused by its header, its data never read."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False, "shape": (10**8,)})
    path = _npz(tmp_path / "liar.npz", {**GOOD, "train_1.npy": header.getvalue() + bytes(64)})
    _refused(path, r"its arrays declare more than 1797 indices \(at 'train_1'\), more than the data set has samples")
    shared_tests = _npz(tmp_path / "liar-test.npz", {**GOOD, "test_1.npy": header.getvalue() + bytes(64)})
    _refused(shared_tests, r"'test_1' declares 100000000 indices, more than the 1797 samples")  # shared, yet bounded


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ({**GOOD, "train_0.npy": _npy(np.array([0, 1, 1]))}, r"'train_0' repeats index 1; a client holds each"),
        ({**GOOD, "test_1.npy": _npy(np.array([6, 6]))}, r"'test_1' repeats index 6"),
        ({**GOOD, "train_1.npy": _npy(np.array([4, 1]))}, r"clients 0 and 1 both train on index 1; a sample trains at"),
        ({**GOOD, "test_1.npy": _npy(np.array([2]))}, r"client 1 tests on index 2, which client 0 trains on"),
        ({**GOOD, "test_0.npy": _npy(np.array([2]))}, r"client 0's train and test share 1 indices \(e.g. 2\)"),
    ],
)
def test_repeated_and_shared_indices_are_refused(tmp_path, members: dict, message: str) -> None:
    _refused(_npz(tmp_path / "bad.npz", members), message)


def test_a_client_the_run_does_not_use_is_still_checked(tmp_path) -> None:
    extra = {"train_2.npy": _npy(np.array([7, 0])), "test_2.npy": _npy(np.array([8]))}
    _refused(_npz(tmp_path / "bad.npz", {**GOOD, **extra}), r"clients 0 and 2 both train on index 0", num_clients=1)


def _header_only(shape: tuple[int, ...], descr: str = "<i8") -> bytes:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
    return header.getvalue()


@pytest.mark.parametrize(
    ("members", "message"),
    [
        ({**GOOD, "train_" + "9" * 5000 + ".npy": b""}, r"unexpected array 'train_9{34}'\.\.\. \(5006 characters\);"),
        ({**GOOD, "x" * 300 + ".npy": b""}, r"unexpected array 'x{40}'\.\.\. \(300 characters\)"),
        ({**GOOD, "train_2\n.npy": b""}, r"unexpected array 'train_2\\n'; the file holds only"),
        ({**GOOD, "train_01.npy": b""}, r"unexpected array 'train_01'"),
        ({**GOOD, "train_1234567890.npy": b""}, r"unexpected array 'train_1234567890'"),
        ({**GOOD, "train_0": b""}, r"unexpected member 'train_0'; arrays are stored as <name>\.npy"),
        ({**GOOD, "dir/": b""}, r"unexpected member 'dir/'"),
        ({**GOOD, "test_0.npy#again": _npy(np.array([9]))}, r"array 'test_0' is stored twice"),
        ({**GOOD, "test_0.npy": b"\x93NUMPY\x01\x00"}, r"array 'test_0' is unreadable \("),
        ({**GOOD, "test_0.npy": b"not an npy"}, r"array 'test_0' is unreadable \("),
        ({**GOOD, "test_0.npy": _npy(np.array([3]))[:-3]}, r"'test_0' holds 5 bytes of data, its header declares 1"),
        ({**GOOD, "test_0.npy": _npy(np.array([3])) + b"!"}, r"'test_0' holds 9 bytes of data, its header declares"),
        ({**GOOD, "test_0.npy": _header_only((-4,))}, r"'test_0' has shape \(-4,\); not a valid \.npy header"),
        ({**GOOD, "test_0.npy": _header_only(())}, r"'test_0' has shape \(\); indices must be a 1-D array"),
        ({**GOOD, "test_0.npy": _header_only((1,), "<f4")}, r"'test_0' has dtype float32; indices must be integers"),
        ({**GOOD, "test_0.npy": _header_only((1,), "|O")}, r"'test_0' has dtype object; indices must be integers"),
        ({**GOOD, "test_0.npy": _header_only((1,), "<U3")}, r"'test_0' has dtype <U3; indices must be integers"),
        ({**GOOD, "test_0.npy": _npy(np.array([2**63], dtype=np.uint64))}, r"'test_0' holds index 9223372036854775808"),
        ({**GOOD, "test_0.npy": _npy(np.array([3], dtype=">i2"))}, None),
    ],
)
def test_malformed_members_are_one_line(tmp_path, members: dict, message: str | None) -> None:
    path = _npz(tmp_path / "bad.npz", members)
    if message is None:  # a big-endian int16 array is fine
        assert read_partition_file(path, 2, DIGITS)[1][0].tolist() == [3]
    else:
        _refused(path, message)


def test_a_damaged_archive_is_one_line(tmp_path) -> None:
    whole = _npz(tmp_path / "whole.npz", GOOD).read_bytes()
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(whole[: len(whole) // 2])
    _refused(truncated, r"not a readable \.npz archive \(")
    flipped = bytearray(whole)
    data_at = whole.index(b"PK\x03\x04") + 30 + len("train_0.npy")
    flipped[data_at + 5] ^= 0xFF  # inside train_0.npy's deflated data
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(bytes(flipped))
    _refused(corrupt, r"array '\w+' is unreadable \(")


def test_a_cifar_file_larger_than_any_batch_is_refused_before_it_is_hashed(tmp_path, monkeypatch) -> None:
    path = tmp_path / "data_batch_1"
    with path.open("wb") as handle:
        handle.truncate(datasets.CIFAR_MAX_FILE_BYTES + 1)  # sparse: no disk used
    hashed = []
    monkeypatch.setattr(datasets.hashlib, "sha256", lambda data: hashed.append(len(data)))
    with pytest.raises(DataError, match="larger than any CIFAR-10 file"):
        verify_cifar_file(path)
    assert hashed == []
