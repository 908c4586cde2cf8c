"""A compiled model that takes uint8 pixel values (`lowbit.compile(..., uint8_input=(mean,
std))`): the image's normalization and the first layer's quantizer are one table per channel,
exact against the model on the normalized float image."""

from __future__ import annotations

import warnings

import pytest
import torch

import lowbit
from lowbit.bench import build_quantized
from lowbit.graph import Quantize
from lowbit.reference.image import normalize_uint8_image
from lowbit.runtime.compiled import compile_model
from lowbit.runtime.engine import ReferenceExecutor
from lowbit.runtime.gpu import GpuExecutor

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _pixels(n: int, size: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)


@pytest.fixture(scope="module")
def compiled():
    q, _ = build_quantized("resnet18", "w1a2", image_size=32, width=0.125, num_classes=10,
                           seed=2, calib_batch=2)
    x = _pixels(3, 32, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        cm = compile_model(q, x, executor="reference", records=False,
                           uint8_input=(MEAN, STD))
    return q, cm, x


def test_uint8_image_equals_the_model_on_its_normalization(compiled):
    q, cm, x = compiled
    plan = cm.plan
    (quant,) = [s for s in plan.steps if isinstance(s, Quantize)]
    assert quant.table is not None and plan.input_dtype == torch.uint8
    assert tuple(plan.params[quant.table].shape) == (3, 256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        y = cm(x)
    # the same plan on the normalized float image (the table is the float path, exactly)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        float_plan = compile_model(q, normalize_uint8_image(x, MEAN, STD), executor="reference",
                                   records=False).plan
    y_float = ReferenceExecutor(float_plan)(normalize_uint8_image(x, MEAN, STD))
    assert torch.equal(y, y_float)
    with torch.no_grad():
        yf = q(normalize_uint8_image(x, MEAN, STD))
    assert torch.equal(y.argmax(1), yf.argmax(1))


def test_gpu_executor_reads_uint8_through_the_stem(compiled):
    """The fused stem takes the table (Triton interpreter here), every tensor equal."""
    _, cm, x = compiled
    ex = GpuExecutor(cm.plan, "cpu")
    assert ex.stems and ex.input_buffer.dtype == torch.uint8
    y, got = ex(x, record=True)
    y_ref, want = ReferenceExecutor(cm.plan)(x, record=True)
    for name, ref in want.items():
        if name in got:
            assert torch.equal(got[name], ref), name
    assert torch.equal(y, y_ref)
    assert len(got) >= len(cm.plan.layers)


def test_uint8_inputs_are_checked(compiled, tmp_path):
    _, cm, x = compiled
    with pytest.raises(TypeError, match="must be a uint8"):
        cm(x.float())
    q = compiled[0]
    with pytest.raises(TypeError, match="must be a uint8"):
        compile_model(q, x.float(), uint8_input=(MEAN, STD))
    with pytest.raises(TypeError, match=r"uint8_input must be \(mean, std\)"):
        compile_model(q, x, uint8_input=MEAN)
    path = tmp_path / "c.safetensors"
    lowbit.save(cm, path)
    loaded = lowbit.load(path)
    assert loaded.plan.image_normalization == cm.plan.image_normalization
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert torch.equal(loaded(x), cm(x))
