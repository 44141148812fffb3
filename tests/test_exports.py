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
