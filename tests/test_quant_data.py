"""Loaders: scikit-learn digits, CIFAR-10 pickle batches and ImageNet-style folders on tiny
generated data."""

import pickle

import numpy as np
import pytest
import torch

from lowbit.quant.data import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    Cifar10,
    ImageFolder,
    cifar10_loaders,
    digits_loaders,
    image_folder_loader,
)


def test_digits_loaders_split_and_normalize():
    train, test = digits_loaders(batch_size=32, seed=1)
    assert len(train.dataset) + len(test.dataset) == 1797
    assert len(test.dataset) == pytest.approx(0.25 * 1797, abs=1)
    x, y = next(iter(train))
    assert x.shape == (32, 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    allx = train.dataset.tensors[0]
    assert float(allx.mean()) == pytest.approx(0.0, abs=1e-4)
    assert float(allx.std()) == pytest.approx(1.0, abs=1e-3)
    assert set(train.dataset.tensors[1].tolist()) == set(range(10))
    with pytest.raises(ValueError, match="batch_size"):
        digits_loaders(batch_size=0)


def _write_cifar(root, n_train=(3, 2), n_test=4):
    rng = np.random.default_rng(0)
    base = root / "cifar-10-batches-py"
    base.mkdir()
    batches = {f"data_batch_{i + 1}": n for i, n in enumerate(n_train)}
    batches["test_batch"] = n_test
    written = {}
    for name, n in batches.items():
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, n).tolist()
        with open(base / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels}, f)
        written[name] = (data, labels)
    return written


def test_cifar10_pickle_batches(tmp_path):
    written = _write_cifar(tmp_path)
    train = Cifar10(tmp_path, train=True)
    assert len(train) == 5
    x, y = train[3]  # first image of data_batch_2
    data, labels = written["data_batch_2"]
    raw = torch.from_numpy(data[0].reshape(3, 32, 32)).float() / 255
    mean = torch.tensor(CIFAR10_MEAN).view(3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(3, 1, 1)
    assert torch.allclose(x, (raw - mean) / std) and int(y) == labels[0]
    _tr, te = cifar10_loaders(tmp_path, batch_size=2)
    assert len(te.dataset) == 4
    xb, yb = next(iter(te))
    assert xb.shape == (2, 3, 32, 32) and yb.tolist() == written["test_batch"][1][:2]
    with pytest.raises(ValueError, match="no CIFAR-10"):
        Cifar10(tmp_path / "cifar-10-batches-py" / "missing")


def test_image_folder(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls, sizes in (("cat", [(20, 12), (9, 9)]), ("dog", [(16, 30)])):
        (tmp_path / cls).mkdir()
        for i, (w, h) in enumerate(sizes):
            arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            Image.fromarray(arr).save(tmp_path / cls / f"{i}.png")
    (tmp_path / "dog" / "notes.txt").write_text("not an image")
    ds = ImageFolder(tmp_path, size=8)
    assert ds.classes == ["cat", "dog"] and len(ds) == 3
    labels = [int(ds[i][1]) for i in range(3)]
    assert labels == [0, 0, 1]
    x, _ = ds[2]
    assert x.shape == (3, 8, 8) and torch.isfinite(x).all()
    xb, yb = next(iter(image_folder_loader(tmp_path, batch_size=3, size=8)))
    assert xb.shape == (3, 3, 8, 8) and yb.tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="no images"):
        ImageFolder(tmp_path / "cat")
    with pytest.raises(ValueError, match="not a directory"):
        ImageFolder(tmp_path / "nope")
    with pytest.raises(ValueError, match="size"):
        ImageFolder(tmp_path, size=0)
