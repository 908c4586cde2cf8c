"""lowbit.quant.datasets: the harder digits (deterministic across processes, no source image
in both splits, transforms that actually move the digits) and benchmark_loaders by name over
tiny CIFAR-10 pickle batches and class folders made in tmp_path."""

import hashlib
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from lowbit.quant.datasets import (
    BENCHMARK_DATASETS,
    Difficulty,
    benchmark_loaders,
    harder_digits,
    harder_digits_loaders,
)

SMALL = Difficulty(copies=2, size=12, patch=(2, 4))
_DIGEST = ("from lowbit.quant.datasets import Difficulty, harder_digits; import hashlib; "
           "h = harder_digits(3, Difficulty(copies=2, size=12, patch=(2, 4))); "
           "print(hashlib.sha256(h.train_x.numpy().tobytes() + h.test_x.numpy().tobytes())"
           ".hexdigest())")


def _digest(h) -> str:
    return hashlib.sha256(h.train_x.numpy().tobytes() + h.test_x.numpy().tobytes()).hexdigest()


def test_same_bytes_in_a_fresh_process_and_other_seeds_differ():
    h = harder_digits(3, SMALL)
    out = subprocess.run([sys.executable, "-c", _DIGEST], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == _digest(h)
    assert _digest(harder_digits(4, SMALL)) != _digest(h)


def test_split_by_source_and_shapes():
    h = harder_digits(0, SMALL)
    train, test = set(h.train_source.tolist()), set(h.test_source.tolist())
    assert not train & test
    assert len(train) + len(test) == 1797
    assert len(test) == pytest.approx(0.25 * 1797, abs=1)
    assert h.train_x.shape == (2 * len(train), 1, 12, 12)
    assert h.test_x.shape == (2 * len(test), 1, 12, 12)
    for src, y in ((h.train_source, h.train_y), (h.test_source, h.test_y)):
        from sklearn.datasets import load_digits

        assert torch.equal(y, torch.from_numpy(load_digits().target)[src])
    assert abs(float(h.train_x.mean())) < 1e-4 and abs(float(h.train_x.std()) - 1) < 1e-3
    counts = torch.bincount(h.test_y, minlength=10)
    assert int(counts.min()) >= 2 * 40  # stratified: every class in the test split


def test_copies_of_one_digit_differ_and_noise_free_ones_keep_the_digit():
    h = harder_digits(0, SMALL)
    a, b = h.train_x[0], h.train_x[1]  # two copies of the same source image
    assert int(h.train_source[0]) == int(h.train_source[1])
    assert float((a - b).abs().mean()) > 0.1
    clean = Difficulty(rotation=0, scale=(1, 1), shear=0, translate=0, occlusion=0, noise=0,
                       copies=2, size=16, zoom=1.0)
    c = harder_digits(0, clean)
    assert torch.allclose(c.train_x[0], c.train_x[1])  # no randomness left: equal copies
    img = c.train_x[0, 0] * c.std + c.mean
    assert float(img.min()) >= -1e-5 and float(img.max()) <= 1 + 1e-5


def test_loaders_shuffle_by_seed_over_fixed_data():
    tr0, te0 = harder_digits_loaders(32, seed=0, difficulty=SMALL)
    tr1, te1 = harder_digits_loaders(32, seed=1, difficulty=SMALL)
    x0, y0 = next(iter(tr0))
    x1, _ = next(iter(tr1))
    assert x0.shape == (32, 1, 12, 12) and y0.dtype == torch.int64
    assert not torch.equal(x0, x1)
    assert torch.equal(next(iter(te0))[0], next(iter(te1))[0])


@pytest.mark.parametrize("kwargs,match", [
    ({"rotation": -1}, "rotation"), ({"occlusion": 1.5}, "occlusion"),
    ({"scale": (1.2, 0.9)}, "scale"), ({"copies": 0}, "copies"),
    ({"patch": (5, 40)}, "patch"), ({"zoom": 0}, "zoom")])
def test_bad_difficulty(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Difficulty(**kwargs)


def test_bad_arguments():
    with pytest.raises(ValueError, match="seed"):
        harder_digits(-1, SMALL)
    with pytest.raises(TypeError, match="Difficulty"):
        harder_digits(0, {"size": 8})
    with pytest.raises(ValueError, match="dataset must be one of"):
        benchmark_loaders("mnist")
    with pytest.raises(ValueError, match="root"):
        benchmark_loaders("cifar10")


def _cifar_batch(path, n, seed):
    rng = np.random.default_rng(seed)
    batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
             b"labels": rng.integers(0, 10, n).tolist()}
    with open(path, "wb") as f:
        pickle.dump(batch, f)
    return batch


def test_cifar10_by_name_from_local_pickles(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    batches = [_cifar_batch(root / f"data_batch_{i}", 5, i) for i in range(1, 6)]
    test = _cifar_batch(root / "test_batch", 7, 9)
    train_loader, test_loader = benchmark_loaders("cifar10", batch_size=4, root=str(tmp_path))
    assert len(train_loader.dataset) == 25 and len(test_loader.dataset) == 7
    x, y = next(iter(test_loader))
    assert x.shape == (4, 3, 32, 32) and y.tolist() == test[b"labels"][:4]
    raw = torch.from_numpy(test[b"data"][0].reshape(3, 32, 32).astype(np.float32)) / 255
    mean = torch.tensor([0.4914, 0.4822, 0.4465]).view(3, 1, 1)
    std = torch.tensor([0.2470, 0.2435, 0.2616]).view(3, 1, 1)
    assert torch.allclose(x[0], (raw - mean) / std, atol=1e-5)
    labels = sorted(int(v) for _, y in train_loader for v in y)
    assert labels == sorted(v for b in batches for v in b[b"labels"])


def test_image_folders_by_name(tmp_path):
    pil = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    made = 0
    for split, n in (("train", 3), ("test", 2)):
        for cls in ("cat", "dog"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(n):
                arr = rng.integers(0, 256, (10 + i, 14, 3), dtype=np.uint8)
                pil.fromarray(arr).save(tmp_path / split / cls / f"{i}.png")
                made += 1
    train_loader, test_loader = benchmark_loaders("folder", batch_size=8, root=str(tmp_path),
                                                  size=8)
    assert len(train_loader.dataset) + len(test_loader.dataset) == made == 10
    x, y = next(iter(test_loader))
    assert x.shape == (4, 3, 8, 8) and sorted(y.tolist()) == [0, 0, 1, 1]
    assert set(BENCHMARK_DATASETS) == {"digits", "digits_hard", "cifar10", "folder"}
