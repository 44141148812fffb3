"""Image corruptions at severities 1-5 with CIFAR-10-C's parameters (Hendrycks & Dietterich, ICLR 2019, for
32x32 images), as pure numpy functions of (N, C, H, W) pixel arrays and a seeded Generator.

`corrupt(images, name, severity, rng, max_value)` keeps the shape, the dtype and the range [0, max_value] of the
raw pixels (uint8 0..255, the 8x8 digits' 0..16, or floats); each registered corruption works on float32 values in
[0, 1] and `corrupt` clips and converts back. Implemented here (vectorized over the batch): the maintained
packages need 32-pixel images, OpenCV and numpy's global random state.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from common.data.arrays import DataError, DatasetArrays
from common.hparams import ConfigError

SEVERITIES = (1, 2, 3, 4, 5)
Corruption = Callable[[np.ndarray, int, np.random.Generator], np.ndarray]


def _level(values: Sequence[Any], severity: int) -> Any:
    return values[severity - 1]


def gaussian_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Additive Gaussian noise, std 0.04..0.10."""
    return x + rng.normal(0.0, _level((0.04, 0.06, 0.08, 0.09, 0.10), severity), x.shape)


def shot_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Poisson (photon) noise: Poisson(x * c) / c, c = 500..50 photons at full intensity."""
    c = _level((500, 250, 100, 75, 50), severity)
    return rng.poisson(x * c) / c


def impulse_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Salt-and-pepper noise on 1%..7% of the values (half set to 1, half to 0)."""
    hit = rng.random(x.shape) < _level((0.01, 0.02, 0.03, 0.05, 0.07), severity)
    salt = rng.random(x.shape) < 0.5
    return np.where(hit, salt.astype(x.dtype), x)


def speckle_noise(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Multiplicative Gaussian noise: x + x * N(0, c), c = 0.06..0.2."""
    return x + x * rng.normal(0.0, _level((0.06, 0.1, 0.12, 0.16, 0.2), severity), x.shape)


def gaussian_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Gaussian blur, sigma 0.4..1 pixels (edges extended)."""
    from scipy import ndimage  # scipy only where an image is corrupted: the config reads this module's names

    sigma = _level((0.4, 0.6, 0.7, 0.8, 1.0), severity)
    return ndimage.gaussian_filter(x, sigma=(0, 0, sigma, sigma), mode="nearest", truncate=4.0)


def disk_kernel(radius: float, alias_sigma: float) -> np.ndarray:
    """A normalized disk of `radius` pixels, anti-aliased by a 3x3 Gaussian of `alias_sigma` (trimmed to its
    support)."""
    span = np.arange(-8, 9)
    xx, yy = np.meshgrid(span, span)
    disk = (xx**2 + yy**2 <= radius**2).astype(np.float64)
    disk /= disk.sum()
    taps = np.exp(-(np.arange(-1, 2) ** 2) / (2 * alias_sigma**2))
    taps /= taps.sum()
    from scipy import ndimage

    kernel = ndimage.correlate1d(ndimage.correlate1d(disk, taps, axis=0, mode="mirror"), taps, axis=1, mode="mirror")
    rows, cols = np.flatnonzero(kernel.sum(1) > 1e-12), np.flatnonzero(kernel.sum(0) > 1e-12)
    return kernel[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]


def defocus_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Defocus: convolution with an anti-aliased disk of radius 0.3..1.5 pixels (edges mirrored)."""
    from scipy import ndimage

    radius, alias = _level(((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1)), severity)
    return ndimage.correlate(x, disk_kernel(radius, alias)[None, None], mode="mirror")


def _linear_matrix(size: int, zoom: float) -> np.ndarray:
    """(size, size) bilinear resampling matrix of a zoom by `zoom` about the centre (edges extended)."""
    centre = (size - 1) / 2
    source = np.clip(centre + (np.arange(size) - centre) / zoom, 0, size - 1)
    low = np.floor(source).astype(int)
    high = np.minimum(low + 1, size - 1)
    frac = source - low
    out = np.zeros((size, size))
    np.add.at(out, (np.arange(size), low), 1 - frac)
    np.add.at(out, (np.arange(size), high), frac)
    return out


def zoom_blur(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """The image averaged with its zooms about the centre by 1.01, 1.02, ... up to 1.05..1.25."""
    steps = _level((5, 10, 15, 20, 25), severity)
    out = x.astype(np.float64)
    for k in range(steps + 1):
        zoom = 1.0 + 0.01 * k
        rows, cols = _linear_matrix(x.shape[2], zoom), _linear_matrix(x.shape[3], zoom)
        out = out + rows @ x @ cols.T
    return out / (steps + 2)


def plasma_fractal(count: int, size: int, decay: float, rng: np.random.Generator) -> np.ndarray:
    """`count` diamond-square height maps of `size` x `size` (a power of two), each scaled to [0, 1]."""
    grid = np.zeros((count, size, size))
    step, wibble = size, 100.0
    while step >= 2:
        half = step // 2
        corners = grid[:, 0:size:step, 0:size:step]
        square = corners + np.roll(corners, -1, axis=1)
        square = square + np.roll(square, -1, axis=2)
        grid[:, half:size:step, half:size:step] = square / 4 + wibble * rng.uniform(-wibble, wibble, square.shape)
        centres = grid[:, half:size:step, half:size:step]
        corners = grid[:, 0:size:step, 0:size:step]
        across = centres + np.roll(centres, 1, axis=1) + corners + np.roll(corners, -1, axis=2)
        grid[:, 0:size:step, half:size:step] = across / 4 + wibble * rng.uniform(-wibble, wibble, across.shape)
        down = centres + np.roll(centres, 1, axis=2) + corners + np.roll(corners, -1, axis=1)
        grid[:, half:size:step, 0:size:step] = down / 4 + wibble * rng.uniform(-wibble, wibble, down.shape)
        step //= 2
        wibble /= decay
    low = grid.min(axis=(1, 2), keepdims=True)
    return (grid - low) / np.maximum(grid.max(axis=(1, 2), keepdims=True) - low, 1e-12)


def fog(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Fog: a plasma fractal of strength 0.2..1.5 added to every channel, then rescaled to the image's maximum."""
    strength, decay = _level(((0.2, 3.0), (0.5, 3.0), (0.75, 2.5), (1.0, 2.0), (1.5, 1.75)), severity)
    height, width = x.shape[2:]
    size = 1 << max(1, int(np.ceil(np.log2(max(height, width)))))
    haze = plasma_fractal(len(x), size, decay, rng)[:, None, :height, :width]
    peak = x.max(axis=(1, 2, 3), keepdims=True)
    return (x + strength * haze) * peak / (peak + strength)


def brightness(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """HSV value raised by 0.05..0.3 (hue and saturation kept; for one channel, x + c)."""
    c = _level((0.05, 0.1, 0.15, 0.2, 0.3), severity)
    value = x.max(axis=1, keepdims=True)
    raised = np.minimum(value + c, 1.0)
    return np.where(value > 0, x * raised / np.maximum(value, 1e-12), raised)


def contrast(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Each channel's deviation from its mean scaled by 0.75..0.15."""
    mean = x.mean(axis=(2, 3), keepdims=True)
    return (x - mean) * _level((0.75, 0.5, 0.4, 0.3, 0.15), severity) + mean


def box_matrix(size_out: int, size_in: int) -> np.ndarray:
    """(size_out, size_in) box resampling as Pillow's BOX filter does it: each output pixel averages the input
    pixels whose centres fall in its footprint (upsampling: the nearest input pixel)."""
    scale = size_in / size_out
    width = max(scale, 1.0)
    centres = (np.arange(size_out) + 0.5) * scale
    offset = (np.arange(size_in)[None, :] + 0.5 - centres[:, None]) / width
    weights = ((offset > -0.5) & (offset <= 0.5)).astype(np.float64)
    return weights / weights.sum(axis=1, keepdims=True)


def pixelate(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """Box-resampled down to 95%..65% of the size and back up (Pillow's BOX filter)."""
    c = _level((0.95, 0.9, 0.85, 0.75, 0.65), severity)
    height, width = x.shape[2:]
    small_h, small_w = max(1, int(height * c)), max(1, int(width * c))
    rows = box_matrix(height, small_h) @ box_matrix(small_h, height)
    cols = box_matrix(width, small_w) @ box_matrix(small_w, width)
    return rows @ x @ cols.T


def jpeg_compression(x: np.ndarray, severity: int, rng: np.random.Generator) -> np.ndarray:
    """JPEG at quality 80..40 (Pillow; RGB images with chroma subsampling, other channel counts one by one)."""
    from PIL import Image

    quality = _level((80, 65, 58, 50, 40), severity)
    pixels = np.rint(np.clip(x, 0, 1) * 255).astype(np.uint8)
    out = np.empty(x.shape, dtype=np.float32)
    for i, image in enumerate(pixels):
        planes = [image.transpose(1, 2, 0)] if image.shape[0] == 3 else list(image)
        decoded = []
        for plane in planes:
            buffer = io.BytesIO()
            Image.fromarray(np.ascontiguousarray(plane)).save(buffer, format="JPEG", quality=quality)
            decoded.append(np.asarray(Image.open(buffer), dtype=np.float32))
        out[i] = decoded[0].transpose(2, 0, 1) if image.shape[0] == 3 else np.stack(decoded)
    return out / 255.0


CORRUPTIONS: dict[str, Corruption] = {
    "gaussian_noise": gaussian_noise,
    "shot_noise": shot_noise,
    "impulse_noise": impulse_noise,
    "speckle_noise": speckle_noise,
    "gaussian_blur": gaussian_blur,
    "defocus_blur": defocus_blur,
    "zoom_blur": zoom_blur,
    "fog": fog,
    "brightness": brightness,
    "contrast": contrast,
    "pixelate": pixelate,
    "jpeg_compression": jpeg_compression,
}


def check_corruption(name: str, severity: int) -> None:
    """ConfigError (one line) unless `name` is a known corruption and `severity` one of 1..5."""
    if name not in CORRUPTIONS:
        raise ConfigError(f"unknown corruption {name!r}; allowed: {', '.join(CORRUPTIONS)}")
    if isinstance(severity, bool) or severity not in SEVERITIES:
        raise ConfigError(f"corruption severity {severity!r} is not one of 1, 2, 3, 4, 5")


def corrupt(
    images: np.ndarray, name: str, severity: int, rng: np.random.Generator, max_value: float = 255.0
) -> np.ndarray:
    """`images` (N, C, H, W) with values in [0, max_value] under corruption `name` at `severity`: same shape,
    dtype and range (integer pixels rounded)."""
    check_corruption(name, severity)
    if images.ndim != 4:
        raise DataError(f"corruptions apply to images (N, C, H, W); got samples of shape {images.shape[1:]}")
    if len(images) == 0:
        return images.copy()
    unit = np.clip(CORRUPTIONS[name](images.astype(np.float32) / max_value, severity, rng), 0.0, 1.0)
    if np.issubdtype(images.dtype, np.integer):
        return np.rint(unit * max_value).astype(images.dtype)
    return np.clip(unit * max_value, 0.0, max_value).astype(images.dtype)


def require_images(data: DatasetArrays, names: Sequence[str]) -> None:
    """DataError (one line) when corruptions are asked of a data set whose samples are not images (C, H, W)."""
    if names and data.x.ndim != 4:
        raise DataError(
            f"run-config 'corruptions' applies to image data sets; '{data.name}' samples have shape {data.input_shape}"
        )


def parse_corruptions(key: str, value: Any) -> tuple[str, ...]:
    """Run-config corruption names: comma-separated (or a list), 'all' for every one, '' for none."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ConfigError(f"run-config '{key}' = {value!r} must be comma-separated corruption names")
    names = [str(item).strip().lower().replace("-", "_") for item in items if str(item).strip()]
    if names == ["all"]:
        return tuple(CORRUPTIONS)
    unknown = [n for n in names if n not in CORRUPTIONS]
    if unknown:
        raise ConfigError(
            f"run-config '{key}' = {value!r} names unknown corruption {unknown[0]!r}; allowed: all, "
            f"{', '.join(CORRUPTIONS)}"
        )
    return tuple(dict.fromkeys(names))


def parse_severities(key: str, value: Any) -> tuple[int, ...]:
    """Run-config severities: comma-separated whole numbers from 1 to 5 (or a list), at least one."""
    items = value.split(",") if isinstance(value, str) else value
    try:
        numbers = [float(item) for item in items if str(item).strip() != ""]
    except (TypeError, ValueError):
        numbers = [0.5]
    if not numbers or any(n != int(n) or int(n) not in SEVERITIES for n in numbers):
        raise ConfigError(f"run-config '{key}' = {value!r} must be comma-separated severities from 1 to 5")
    return tuple(sorted({int(n) for n in numbers}))
