"""A harder accuracy benchmark that needs no download: scikit-learn's digits, upscaled under
random affine transforms, occlusion and noise (`harder_digits_*`), and one entry point that
builds the benchmark loaders by name (`benchmark_loaders`).

The default `Difficulty` is the benchmark's: 16x16 images, where the FP32 digits ResNet of
lowbit.models reaches about 90% (benchmarks/accuracy.py reports the mean and std over seeds).
Other sizes are one argument away (`Difficulty(size=32, patch=(6, 12))`), but the zoo's digits
networks see about 19x19 pixels at their global pooling and cost 4x more per image at 32x32.

Construction (every draw from one torch.Generator seeded by `seed`, so the data are the same
bytes in every run and process): the 1797 8x8 images (scaled to [0, 1]) are split 75/25 by
source image, stratified by class, so no augmented copy of a test digit is ever trained on.
Each source image gives `copies` images: bilinear resampling onto a size x size canvas (the
digit spans `zoom` of it) through a random affine map (rotation, anisotropic scale, shear,
translation), then with probability `occlusion` a rectangle of random side in `patch` (pixels)
filled with a random grey level, then Gaussian noise of std `noise`. Images are standardized
with the training set's mean and std.

Real datasets (the data users have) load through `lowbit.quant.data`: CIFAR-10 from its python
pickle batches (`cifar10_loaders(root)`) and class-per-folder images (`image_folder_loader(root)`,
which needs Pillow). `benchmark_loaders("cifar10", root=...)` and `("folder", root=...)` reach
them by name.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from .data import _check_batch_size, cifar10_loaders, digits_loaders, image_folder_loader


@dataclass(frozen=True)
class Difficulty:
    """How the harder digits are drawn (units: degrees, fractions of the canvas, pixels).

    rotation: max |angle|; scale: (min, max) factor per axis; shear: max |angle|; translate:
    max shift per axis as a fraction of the canvas; occlusion: probability of one patch;
    patch: (min, max) side of it in pixels; noise: Gaussian std on [0, 1] images; copies:
    augmented images per source image; size: canvas side; zoom: share of the canvas the
    untransformed digit spans."""

    rotation: float = 20.0
    scale: tuple[float, float] = (0.85, 1.1)
    shear: float = 10.0
    translate: float = 0.08
    occlusion: float = 0.4
    patch: tuple[int, int] = (3, 6)
    noise: float = 0.15
    copies: int = 4
    size: int = 16
    zoom: float = 0.75

    def __post_init__(self) -> None:
        for name in ("rotation", "shear", "translate", "occlusion", "noise"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {v!r}")
        if not self.occlusion <= 1:
            raise ValueError(f"occlusion must be a probability in [0, 1], got {self.occlusion}")
        lo, hi = self.scale
        if not 0 < lo <= hi:
            raise ValueError(f"scale must be (min, max) with 0 < min <= max, got {self.scale}")
        for name in ("copies", "size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if not 1 <= self.patch[0] <= self.patch[1] <= self.size:
            raise ValueError(f"patch must be (min, max) sides in 1..size, got {self.patch}")
        if not 0 < self.zoom <= 1:
            raise ValueError(f"zoom must be in (0, 1], got {self.zoom}")


@dataclass(frozen=True)
class HarderDigits:
    """Standardized images [N, 1, size, size] float32, labels int64 [N] and the index of the
    source digit (into sklearn's 1797) of every image, for the train and test splits."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    train_source: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    test_source: torch.Tensor
    mean: float
    std: float


def _uniform(g: torch.Generator, n: int, lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)


def _affine(g: torch.Generator, n: int, d: Difficulty) -> torch.Tensor:
    """[n, 2, 3] output -> input maps for affine_grid (normalized coordinates)."""
    rot = torch.deg2rad(_uniform(g, n, -d.rotation, d.rotation))
    shear = torch.tan(torch.deg2rad(_uniform(g, n, -d.shear, d.shear)))
    sx, sy = (_uniform(g, n, *d.scale) for _ in range(2))
    shift = _uniform(g, 2 * n, -2 * d.translate, 2 * d.translate).reshape(n, 2)
    c, s = torch.cos(rot), torch.sin(rot)
    forward = torch.zeros(n, 2, 2, dtype=torch.float64)  # rotation . shear . scale . zoom
    forward[:, 0, 0] = c * sx * d.zoom
    forward[:, 0, 1] = (c * shear - s) * sy * d.zoom
    forward[:, 1, 0] = s * sx * d.zoom
    forward[:, 1, 1] = (s * shear + c) * sy * d.zoom
    inverse = torch.linalg.inv(forward)
    offset = -(inverse @ shift[:, :, None])
    return torch.cat([inverse, offset], dim=2).float()


def _occlude(g: torch.Generator, images: torch.Tensor, d: Difficulty) -> None:
    n, size = images.shape[0], images.shape[-1]
    hit = torch.rand(n, generator=g) < d.occlusion
    lo, hi = d.patch
    side = torch.randint(lo, hi + 1, (n, 2), generator=g)
    corner = (torch.rand(n, 2, generator=g) * (size - side + 1)).long()
    grey = torch.rand(n, generator=g)
    for i in torch.nonzero(hit).flatten().tolist():
        (h, w), (top, left) = side[i].tolist(), corner[i].tolist()
        images[i, :, top:top + h, left:left + w] = grey[i]


def _augment(g: torch.Generator, source: torch.Tensor, d: Difficulty) -> torch.Tensor:
    """`copies` augmented images of every source image: [n * copies, 1, size, size]."""
    src = source.repeat_interleave(d.copies, dim=0)
    theta = _affine(g, src.shape[0], d)
    grid = F.affine_grid(theta, [src.shape[0], 1, d.size, d.size], align_corners=False)
    out = F.grid_sample(src, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    _occlude(g, out, d)
    return out + d.noise * torch.randn(out.shape, generator=g)


def harder_digits(seed: int = 0, difficulty: Difficulty = Difficulty(),
                  test_fraction: float = 0.25) -> HarderDigits:
    """The harder digits (module doc) drawn with `seed`; cached per process (do not modify
    the returned tensors in place)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    if not isinstance(difficulty, Difficulty):
        raise TypeError(f"difficulty must be a Difficulty, got {type(difficulty).__name__}")
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) \
            or not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    return _draw(seed, difficulty, float(test_fraction))


@functools.lru_cache(maxsize=4)
def _draw(seed: int, difficulty: Difficulty, test_fraction: float) -> HarderDigits:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    images = torch.from_numpy(d.images.astype(np.float32) / 16.0)[:, None]
    labels = torch.from_numpy(d.target.astype(np.int64))
    train_idx, test_idx = train_test_split(np.arange(len(labels)), test_size=test_fraction,
                                           random_state=seed, stratify=d.target)
    g = torch.Generator().manual_seed(seed)
    parts = []
    for idx in (np.sort(train_idx), np.sort(test_idx)):
        src = torch.from_numpy(idx)
        parts.append((_augment(g, images[src], difficulty),
                      labels[src].repeat_interleave(difficulty.copies),
                      src.repeat_interleave(difficulty.copies)))
    (xtr, ytr, str_), (xte, yte, ste) = parts
    mean, std = float(xtr.mean()), float(xtr.std())
    return HarderDigits((xtr - mean) / std, ytr, str_, (xte - mean) / std, yte, ste, mean, std)


def harder_digits_datasets(seed: int = 0, difficulty: Difficulty = Difficulty(),
                           test_fraction: float = 0.25) -> tuple[TensorDataset, TensorDataset]:
    """(train, test) TensorDatasets of (image [1, size, size], label) over `harder_digits`."""
    h = harder_digits(seed, difficulty, test_fraction)
    return TensorDataset(h.train_x, h.train_y), TensorDataset(h.test_x, h.test_y)


def harder_digits_loaders(batch_size: int = 64, seed: int = 0, data_seed: int = 0,
                          difficulty: Difficulty = Difficulty(), test_fraction: float = 0.25
                          ) -> tuple[DataLoader, DataLoader]:
    """(shuffled train loader, test loader): the data drawn with `data_seed` (fixed by
    default: one benchmark dataset), the shuffling order with `seed`."""
    _check_batch_size(batch_size)
    train, test = harder_digits_datasets(data_seed, difficulty, test_fraction)
    g = torch.Generator().manual_seed(seed)
    return (DataLoader(train, batch_size=batch_size, shuffle=True, generator=g),
            DataLoader(test, batch_size=256))


#: datasets benchmark_loaders builds, with their input shape and classes
BENCHMARK_DATASETS = {"digits": ((1, 8, 8), 10), "digits_hard": ((1, 32, 32), 10),
                      "cifar10": ((3, 32, 32), 10), "folder": (None, None)}


def benchmark_loaders(name: str, batch_size: int = 64, seed: int = 0, root: str | None = None,
                      size: int = 32) -> tuple[DataLoader, DataLoader]:
    """(train, test) loaders of a benchmark dataset by name (BENCHMARK_DATASETS): "digits"
    (split by `seed`), "digits_hard" (fixed data, order by `seed`), "cifar10" (pickle batches
    under `root`), "folder" (root/train and root/test class folders, images resized to
    `size`)."""
    if name not in BENCHMARK_DATASETS:
        raise ValueError(f"dataset must be one of {', '.join(BENCHMARK_DATASETS)}, got {name!r}")
    if name == "digits":
        return digits_loaders(batch_size, seed)
    if name == "digits_hard":
        return harder_digits_loaders(batch_size, seed)
    if root is None:
        raise ValueError(f"dataset {name!r} needs root= (the folder that holds it)")
    if name == "cifar10":
        torch.manual_seed(seed)
        return cifar10_loaders(root, batch_size)
    torch.manual_seed(seed)
    return (image_folder_loader(f"{root}/train", batch_size, size, shuffle=True),
            image_folder_loader(f"{root}/test", batch_size, size))

