"""Data loaders for quantization experiments: scikit-learn's digits (ships with the package),
CIFAR-10 from its python pickle batches, and ImageNet-style class folders.

Every dataset yields (image float32 [C, H, W] normalized per channel, label int64).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp")


def _check_batch_size(batch_size: object) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    return batch_size


def _normalize(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    m = torch.tensor(mean, dtype=x.dtype).view(-1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype).view(-1, 1, 1)
    return (x - m) / s


def digits_datasets(seed: int = 0, test_fraction: float = 0.25
                    ) -> tuple[TensorDataset, TensorDataset]:
    """scikit-learn digits (1797 8x8 grey images, 10 classes), stratified split by `seed`,
    images scaled to [0, 1] then standardized with the training set's mean and std."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    d = load_digits()
    x = d.images.astype(np.float32) / 16.0
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=test_fraction, random_state=seed,
                                          stratify=y)
    mean, std = float(xtr.mean()), float(xtr.std())

    def wrap(xs: np.ndarray, ys: np.ndarray) -> TensorDataset:
        t = (torch.from_numpy(xs)[:, None] - mean) / std
        return TensorDataset(t, torch.from_numpy(ys))

    return wrap(xtr, ytr), wrap(xte, yte)


def digits_loaders(batch_size: int = 64, seed: int = 0, test_fraction: float = 0.25
                   ) -> tuple[DataLoader, DataLoader]:
    """(shuffled train loader, test loader) over `digits_datasets`."""
    _check_batch_size(batch_size)
    train, test = digits_datasets(seed, test_fraction)
    g = torch.Generator().manual_seed(seed)
    return (DataLoader(train, batch_size=batch_size, shuffle=True, generator=g),
            DataLoader(test, batch_size=256))


class Cifar10(Dataset):
    """CIFAR-10 from the python version's pickle batches (data_batch_1..5, test_batch) in `root`
    or `root/cifar-10-batches-py`; 32x32 RGB, normalized with the usual CIFAR-10 statistics."""

    def __init__(self, root: str | Path, train: bool = True) -> None:
        root = Path(root)
        if (root / "cifar-10-batches-py").is_dir():
            root = root / "cifar-10-batches-py"
        names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
        files = [root / n for n in names if (root / n).is_file()]
        if not files:
            raise ValueError(f"root {str(root)!r} holds no CIFAR-10 pickle batches "
                             f"({', '.join(names)})")
        data, labels = [], []
        for f in files:
            with open(f, "rb") as fh:
                batch = pickle.load(fh, encoding="bytes")
            data.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.extend(int(v) for v in batch[b"labels"])
        self.images = torch.from_numpy(np.concatenate(data))
        self.labels = torch.tensor(labels, dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.images[i].float() / 255.0
        return _normalize(x, CIFAR10_MEAN, CIFAR10_STD), self.labels[i]


class ImageFolder(Dataset):
    """ImageNet-style folders: root/<class>/<image>; classes are the sorted sub-folder names.
    Images are converted to RGB, resized (shorter side) to `size` and centre-cropped to
    size x size, then normalized with the ImageNet statistics."""

    def __init__(self, root: str | Path, size: int = 224) -> None:
        root = Path(root)
        if not root.is_dir():
            raise ValueError(f"root {str(root)!r} is not a directory")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an int >= 1, got {size!r}")
        self.size = size
        self.classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.samples = [(f, c) for c, name in enumerate(self.classes)
                        for f in sorted((root / name).rglob("*"))
                        if f.suffix.lower() in IMAGE_SUFFIXES]
        if not self.samples:
            raise ValueError(f"root {str(root)!r} holds no images in class sub-folders "
                             f"(suffixes {', '.join(IMAGE_SUFFIXES)})")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        from PIL import Image

        path, label = self.samples[i]
        with Image.open(path) as im:
            im = im.convert("RGB")
            w, h = im.size
            k = self.size / min(w, h)
            im = im.resize((max(self.size, round(w * k)), max(self.size, round(h * k))),
                           Image.BILINEAR)
            w, h = im.size
            left, top = (w - self.size) // 2, (h - self.size) // 2
            im = im.crop((left, top, left + self.size, top + self.size))
            arr = np.asarray(im, dtype=np.float32) / 255.0
        x = torch.from_numpy(arr).permute(2, 0, 1).contiguous()
        return _normalize(x, IMAGENET_MEAN, IMAGENET_STD), torch.tensor(label)


def cifar10_loaders(root: str | Path, batch_size: int = 128, num_workers: int = 0
                    ) -> tuple[DataLoader, DataLoader]:
    """(shuffled train loader, test loader) over CIFAR-10's pickle batches in `root`."""
    _check_batch_size(batch_size)
    return (DataLoader(Cifar10(root, True), batch_size, shuffle=True, num_workers=num_workers),
            DataLoader(Cifar10(root, False), batch_size, num_workers=num_workers))


def image_folder_loader(root: str | Path, batch_size: int = 64, size: int = 224,
                        shuffle: bool = False, num_workers: int = 0) -> DataLoader:
    """Loader over an ImageNet-style folder (see ImageFolder)."""
    _check_batch_size(batch_size)
    return DataLoader(ImageFolder(root, size), batch_size, shuffle=shuffle,
                      num_workers=num_workers)
