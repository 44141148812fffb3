"""Data exports (`pflower export`): the rows a sweep reads come back bit for bit, as raw arrays and as lossless WebP,
for grey and colour images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.data.arrays import DataError, DatasetArrays
from experiments.run.exports import _unwebp, _webp, probe_export, read_export, write_export


def _images(shape: tuple[int, ...], count: int = 12) -> DatasetArrays:
    rng = np.random.default_rng(len(shape) + shape[0])
    x = rng.integers(0, 256, size=(count, *shape), dtype=np.uint8)
    return DatasetArrays(
        "toy", x, np.arange(count, dtype=np.int64) % 3, 3, (0.5,) * shape[0], (0.25,) * shape[0], 255.0
    )


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32)], ids=["digits", "mnist", "cifar"])
@pytest.mark.parametrize("webp", [False, True], ids=["raw", "webp"])
def test_an_export_serves_its_rows_bit_for_bit(tmp_path: Path, shape: tuple[int, ...], webp: bool) -> None:
    data = _images(shape)
    rows = [0, 3, 4, 11]
    write_export(data, rows, tmp_path / "export.npz", webp=webp)
    served, held = read_export(tmp_path / "export.npz")
    assert held == set(rows) and served.x.shape == data.x.shape and served.x.dtype == np.uint8
    np.testing.assert_array_equal(served.x[rows], data.x[rows])
    assert not served.x[[1, 2]].any()  # rows it does not hold are zeros, never read by the runs it was made for
    np.testing.assert_array_equal(served.y, data.y)


def test_a_time_series_export_serves_its_rows_bit_for_bit(tmp_path: Path) -> None:
    """HAR's samples are 9 channels x 128 readings of float32 (the behaviour hash of a HAR study exports its tiny
    stand-in this way)."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((10, 9, 128)).astype(np.float32)
    data = DatasetArrays("har", x, np.arange(10, dtype=np.int64) % 6, 6, (0.0,) * 9, (1.0,) * 9, 1.0)
    write_export(data, [2, 7], tmp_path / "har.npz")
    assert probe_export(tmp_path / "har.npz") == "har"
    served, held = read_export(tmp_path / "har.npz")
    assert held == {2, 7} and served.x.shape == (10, 9, 128) and served.x.dtype == np.float32
    np.testing.assert_array_equal(served.x[[2, 7]], x[[2, 7]])
    with pytest.raises(DataError, match="WebP stores uint8 images"):
        write_export(data, [2], tmp_path / "har-webp.npz", webp=True)


def test_a_colour_image_in_a_grey_export_is_refused() -> None:
    colour = _images((3, 8, 8), 2).x
    blob, ends = _webp(colour)
    with pytest.raises(DataError, match="not grey"):
        _unwebp(blob, ends, (1, 8, 8))


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32)], ids=["grey", "colour"])
@pytest.mark.parametrize("webp", [False, True], ids=["raw", "webp"])
def test_the_probe_decodes_the_first_image_and_names_the_data_set(
    tmp_path: Path, shape: tuple[int, ...], webp: bool
) -> None:
    write_export(_images(shape), [1, 5], tmp_path / "export.npz", webp=webp)
    assert probe_export(tmp_path / "export.npz") == "toy"
    with pytest.raises(DataError, match="not readable"):
        probe_export(tmp_path / "nothing.npz")


def _resigned(path: Path, out: Path, **changes: np.ndarray) -> Path:
    """The export at `path` with some arrays replaced and its checksum made again (as an attacker, or a buggy
    writer, could): only the content checks stand between it and the runs."""
    from experiments.run.exports import CHECKSUM, _digest

    with np.load(path) as z:
        arrays = {**dict(z), **changes}
    np.savez(out, **{**arrays, CHECKSUM: _digest(arrays)})
    return out


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"y": np.array([0, 1, 7, 0, 1, 2, 0, 1, 2, 0, 1, 2])}, "labels outside 0..2"),
        ({"y": np.arange(5) % 3}, "5 labels of int64 for 12 rows"),
        ({"index": np.array([0, 3, 4, 12])}, "rows outside the data set"),
        ({"index": np.array([0, 4, 3, 11])}, "rows not increasing"),
        ({"index": np.array([0, 3, 4])}, "4 images for 3 rows"),
        ({"x_shape": np.array([1, 8, 100_000])}, "image shape (1, 8, 100000)"),
        ({"x_shape": np.array([64])}, "image shape (64,)"),
        ({"x_shape": np.array([1, 1, 8, 8])}, "image shape (1, 1, 8, 8)"),
        ({"x_dtype": np.array("object")}, "image dtype object"),
    ],
)
def test_an_export_whose_labels_rows_or_sizes_do_not_fit_its_data_set_is_refused(
    tmp_path: Path, changes: dict, message: str
) -> None:
    write_export(_images((1, 8, 8)), [0, 3, 4, 11], tmp_path / "export.npz", webp=True)
    bad = _resigned(tmp_path / "export.npz", tmp_path / "bad.npz", **changes)
    for read in (read_export, probe_export):
        with pytest.raises(
            DataError, match=rf"^data export {bad}: refused: .*{message.replace('(', '.').replace(')', '.')}"
        ):
            read(bad)


def test_an_image_of_another_format_or_size_is_refused_before_its_pixels_are_decoded(tmp_path: Path) -> None:
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(png, format="PNG")
    data = np.frombuffer(png.getvalue(), np.uint8)
    with pytest.raises(DataError, match="image 0 of the export is not a WebP image"):
        _unwebp(data, np.array([data.size]), (1, 8, 8))
    large, ends = _webp(np.zeros((1, 1, 64, 64), np.uint8))
    with pytest.raises(DataError, match="image 0 of the export is 64x64, the data set's 8x8"):
        _unwebp(large, ends, (1, 8, 8))
    with pytest.raises(DataError, match="offsets are not increasing"):
        _unwebp(large, np.array([large.size + 5]), (1, 64, 64))


def test_an_export_damaged_in_transfer_or_from_before_checksums_is_refused(tmp_path: Path) -> None:
    from experiments.run.exports import CHECKSUM

    write_export(_images((1, 8, 8)), [0, 3], tmp_path / "export.npz")
    with np.load(tmp_path / "export.npz") as z:
        arrays = dict(z)
    arrays["y"] = arrays["y"].copy()
    arrays["y"][0] = 1
    np.savez(tmp_path / "damaged.npz", **arrays)
    with pytest.raises(DataError, match="its checksum does not match its content"):
        read_export(tmp_path / "damaged.npz")
    del arrays[CHECKSUM]
    np.savez(tmp_path / "old.npz", **arrays)
    with pytest.raises(DataError, match="it carries no checksum .*write it again with `pflower export`"):
        read_export(tmp_path / "old.npz")
