"""The four-domain Digits benchmark, built offline (DapperFL's Digits: MNIST, USPS, SVHN, SYN): MNIST and USPS as
they are, an MNIST-M-style domain and a SYN-style domain made from what is on this machine. All 32x32 RGB uint8.

- mnist: MNIST digits resized from 28x28 to 32x32 (bilinear), grey in all three channels.
- usps: USPS (torchvision's format in `data-dir/USPS`) resized from 16x16 to 32x32 the same way.
Both are resized, as the FedML domain-generalization Digits loader the paper ran on does: padding MNIST instead
(version 1 of the cache) left its digits at ~20 of the 32 pixels against USPS's full 32, and a model trained on
the MNIST domain alone scored 35.9% on USPS against 47.5% with both resized.
- mnist-m: MNIST digits blended over CIFAR-10 images as MNIST-M is made over photo crops: out = |background -
  digit|, so the colours invert where the digit is (stands in for SVHN's colour and clutter).
- syn: digits rendered with the TrueType fonts matplotlib ships (DejaVu, STIX, Computer Modern), random colours,
  backgrounds, scale, position, rotation and blur (stands in for SynDigits).
Built once with a fixed seed (a data set, not part of a run's randomness) and cached as an .npz.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from common.data.arrays import DataError, DatasetArrays

DOMAINS = ("mnist", "usps", "mnist-m", "syn")
DOMAIN_SIZE = 20_000  # samples per domain at most (USPS has 9,298)
BUILD_SEED = 20_240_601
CACHE_VERSION = 2
MEAN, STD = (0.349, 0.349, 0.341), (0.327, 0.326, 0.327)  # over the built set
_FONTS = (
    "DejaVuSans",
    "DejaVuSans-Bold",
    "DejaVuSans-Oblique",
    "DejaVuSans-BoldOblique",
    "DejaVuSansMono",
    "DejaVuSansMono-Bold",
    "DejaVuSerif",
    "DejaVuSerif-Bold",
    "DejaVuSerif-Italic",
    "DejaVuSerif-BoldItalic",
    "STIXGeneral",
    "STIXGeneralBol",
    "STIXGeneralItalic",
    "STIXGeneralBolIta",
    "cmr10",
    "cmb10",
    "cmss10",
    "cmtt10",
    "cmti10",
)


def grey32(digits: np.ndarray) -> np.ndarray:
    """(N, H, W) grey uint8 -> (N, 3, 32, 32) uint8, resized bilinearly."""
    import torch
    from torch.nn import functional as F

    big = F.interpolate(torch.from_numpy(digits).float()[:, None], size=(32, 32), mode="bilinear", align_corners=False)
    return np.repeat(big.round().clamp(0, 255).to(torch.uint8).numpy(), 3, axis=1)


def usps_missing(data_dir: Path, dataset: str = "usps") -> DataError | None:
    """The error naming `dataset` when torchvision's USPS files are not in `data-dir/USPS` (None: they are)."""
    root = data_dir / "USPS"
    if (root / "usps.bz2").exists() and (root / "usps.t.bz2").exists():
        return None
    return DataError(
        f"{dataset}: expected usps.bz2 and usps.t.bz2 in {root} (set run-config 'data-dir' or $PFL_DATA_DIR)"
    )


def read_usps(data_dir: Path, dataset: str = "usps") -> tuple[np.ndarray, np.ndarray]:
    """USPS from torchvision's files in `data-dir/USPS`: x (9298, 16, 16) uint8 (the 7,291 training rows, then the
    2,007 test rows) and y; a DataError naming `dataset` and the files when they are missing."""
    from torchvision import datasets

    root = data_dir / "USPS"
    if missing := usps_missing(data_dir, dataset):
        raise missing
    parts = [datasets.USPS(str(root), train=train, download=False) for train in (True, False)]
    x = np.concatenate([np.asarray(p.data, dtype=np.uint8) for p in parts])
    y = np.concatenate([np.asarray(p.targets, dtype=np.int64) for p in parts])
    return x, y


def _usps(data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    x, y = read_usps(data_dir, "digit-domains")
    return grey32(x), y


def mnist_m(digits: np.ndarray, backgrounds: np.ndarray) -> np.ndarray:
    """|background - digit| per channel: (N, 3, 32, 32) from (N, 3, 32, 32) digits and backgrounds (uint8)."""
    return np.abs(backgrounds.astype(np.int16) - digits.astype(np.int16)).astype(np.uint8)


def _fonts() -> list[str]:
    import matplotlib

    folder = os.path.join(matplotlib.get_data_path(), "fonts", "ttf")
    found = {Path(p).stem: p for p in glob.glob(os.path.join(folder, "*.ttf"))}
    fonts = [found[name] for name in _FONTS if name in found]
    if not fonts:
        raise DataError(f"digit-domains: no fonts found in {folder}")
    return fonts


def render_digits(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """SYN-style digits: one per label, (N, 3, 32, 32) uint8."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    fonts = _fonts()
    out = np.empty((len(labels), 3, 32, 32), dtype=np.uint8)
    for i, label in enumerate(labels):
        background = rng.integers(0, 256, size=3)
        foreground = rng.integers(0, 256, size=3)
        while np.abs(foreground.astype(int) - background).sum() < 160:  # keep the digit visible
            foreground = rng.integers(0, 256, size=3)
        canvas = Image.new("RGB", (64, 64), tuple(int(c) for c in background))
        font = ImageFont.truetype(fonts[int(rng.integers(len(fonts)))], size=int(rng.integers(34, 52)))
        draw = ImageDraw.Draw(canvas)
        left, top, right, bottom = draw.textbbox((0, 0), str(int(label)), font=font)
        x = (64 - (right - left)) / 2 - left + rng.uniform(-5, 5)
        y = (64 - (bottom - top)) / 2 - top + rng.uniform(-5, 5)
        draw.text((x, y), str(int(label)), font=font, fill=tuple(int(c) for c in foreground))
        canvas = canvas.rotate(
            float(rng.uniform(-20, 20)), resample=Image.Resampling.BILINEAR, fillcolor=tuple(int(c) for c in background)
        )
        blur = ImageFilter.GaussianBlur(float(rng.uniform(0, 1.0)))
        canvas = canvas.resize((32, 32), Image.Resampling.BILINEAR).filter(blur)
        out[i] = np.asarray(canvas, dtype=np.uint8).transpose(2, 0, 1)
    return out


def build_domains(data_dir: Path, load: Callable[[str], DatasetArrays]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (N, 3, 32, 32) uint8, y, domain index per sample, for the four domains in DOMAINS order (`load` gives
    MNIST and CIFAR-10)."""
    rng = np.random.default_rng(BUILD_SEED)
    mnist, cifar = load("mnist"), load("cifar10")
    chosen = rng.permutation(len(mnist.y))
    first, second = chosen[:DOMAIN_SIZE], chosen[DOMAIN_SIZE : 2 * DOMAIN_SIZE]
    usps_x, usps_y = _usps(data_dir)
    backgrounds = cifar.x[rng.choice(len(cifar.y), size=DOMAIN_SIZE, replace=False)]
    syn_y = rng.integers(0, 10, size=DOMAIN_SIZE)
    parts = [
        (grey32(mnist.x[first, 0]), mnist.y[first]),
        (usps_x, usps_y),
        (mnist_m(grey32(mnist.x[second, 0]), backgrounds), mnist.y[second]),
        (render_digits(syn_y, rng), syn_y.astype(np.int64)),
    ]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts]).astype(np.int64)
    domain = np.concatenate([np.full(len(p[1]), d, dtype=np.int64) for d, p in enumerate(parts)])
    return x, y, domain


def _cache_file(cache_dir: Path) -> Path:
    return cache_dir / f"digit-domains-v{CACHE_VERSION}.npz"


def digit_domains_cached(cache_dir: Path) -> bool:
    """Whether the four domains were built and cached already (then no data set file is read for them)."""
    return _cache_file(cache_dir).exists()


def digit_domains(data_dir: Path, cache_dir: Path, load: Callable[[str], DatasetArrays]) -> DatasetArrays:
    """The four domains pooled (samples ordered by domain), built on first use and cached."""
    cache = _cache_file(cache_dir)
    if cache.exists():
        with np.load(cache, allow_pickle=False) as saved:
            x, y, domain = saved["x"], saved["y"], saved["domain"]
    else:
        x, y, domain = build_domains(data_dir, load)
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(partial, x=x, y=y, domain=domain)
        os.replace(partial, cache)
    return DatasetArrays("digit-domains", x, y, 10, MEAN, STD, 255.0, domain=domain, domain_names=DOMAINS)


def domain_partition(
    domain: np.ndarray, num_clients: int, share: float, test_size: int, seed: int
) -> tuple[list[np.ndarray], list[int], list[np.ndarray]]:
    """DapperFL's Digits split: every domain gets at least one client and every client one domain (seeded); a
    client takes round(share * domain size) samples of its domain, disjoint from the other clients' and from the
    domain's held-out `test_size` samples. Returns each client's indices, each client's domain, each domain's
    held-out test indices."""
    num_domains = int(domain.max()) + 1
    if num_clients < num_domains:
        raise DataError(
            f"the domains partition needs at least {num_domains} clients (one per domain), got {num_clients}"
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(num_clients)
    assigned = np.empty(num_clients, dtype=np.int64)
    assigned[order[:num_domains]] = np.arange(num_domains)
    assigned[order[num_domains:]] = rng.integers(0, num_domains, size=num_clients - num_domains)
    clients: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * num_clients
    held_out = []
    for d in range(num_domains):
        members = np.flatnonzero(assigned == d)
        samples = rng.permutation(np.flatnonzero(domain == d))
        take = max(2, int(round(share * len(samples))))
        needed = test_size + take * len(members)
        if needed > len(samples):
            raise DataError(
                f"domain {DOMAINS[d] if d < len(DOMAINS) else d} has {len(samples)} samples: "
                f"{len(members)} clients x {take} (domain-share {share:g}) + {test_size} held out "
                "(domain-test-size) do not fit; lower domain-share or domain-test-size"
            )
        held_out.append(np.sort(samples[:test_size]))
        for k, client in enumerate(members):
            clients[client] = np.sort(samples[test_size + k * take : test_size + (k + 1) * take])
    return clients, assigned.tolist(), held_out
