"""The GPU executor (lowbit.runtime.gpu) on the CPU: Triton ops under TRITON_INTERPRET=1, the
conv / GEMM kernels through the reference shim (same bind contract), on small zoo models at
the issue's precisions. Every tensor a plan writes equals the reference executor's bit for
bit (storage: bytes, bit planes with their padding bits, wide int16 / int32, float32), the
logits too. Models are narrow (width 1/8 - 1/2) and images tiny: the interpreter is slow.
The same executor on a GPU: tests/test_engine_gpu_cuda.py.
"""

from __future__ import annotations

import warnings
from functools import cache

import pytest
import torch
from torch import nn

import lowbit
from lowbit.bench import build_quantized, compile_plan, random_images
from lowbit.core import ConvWorkload, GemmWorkload
from lowbit.graph import TORCH_FP16, Concat, FloatFallback, Layer, choose_impl
from lowbit.graph.impl import unsupported_reason
from lowbit.graph.launches import PlanOptions, with_launches
from lowbit.reference import random_inputs, run
from lowbit.runtime.buffers import lifetimes, plan_arena, tensor_bytes
from lowbit.runtime.compiled import compile_model
from lowbit.runtime.engine import ReferenceExecutor
from lowbit.runtime.gpu import GpuExecutor
from lowbit.runtime.layers import Float64Kernel, fp16_kernel, interpreted_kernel

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _compile(q: nn.Module, x: torch.Tensor, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile_model(q, x, **options)


@cache
def zoo_plan(name: str, recipe: str, batch: int, size: tuple[int, int], width: float,
             exact_bias: bool = True):
    q, _ = build_quantized(name, recipe, image_size=size, width=width, num_classes=10,
                           seed=3, calib_batch=2)
    x = random_images(batch, size, 1 if name.startswith("digits") else 3, seed=4)
    return compile_plan(q, x, exact_bias)[0], x


def assert_matches_reference(plan, ex: GpuExecutor, x: torch.Tensor) -> int:
    """Record both executors; every tensor and the result equal. Returns tensors compared."""
    y, got = ex(x, record=True)
    y_ref, want = ReferenceExecutor(plan)(x, record=True)
    assert set(got) == set(want)
    for name, ref in want.items():
        have = got[name]
        assert have.dtype == ref.dtype and have.shape == ref.shape, name
        assert torch.equal(have, ref), f"{name}: {(have != ref).sum().item()} of {ref.numel()}"
    assert torch.equal(y, y_ref)
    return len(want)


ZOO = [  # (model, recipe, batch, image, width, fused stem)
    ("resnet18", "w1a2", 2, (32, 40), 0.125, True),    # int8 stem + pool fused, 24-bit residuals
    ("resnet18", "w2a2-all", 3, (32, 32), 0.125, False),  # bit-plane image, 16-bit residuals
    ("vgg16", "w4a4", 1, (32, 32), 0.125, True),       # 3x3/1 stem, pools fused, adaptive pool
    ("alexnet", "w1a2", 1, (64, 64), 0.125, True),     # 11x11/4 stem, pools after epilogues
    ("resnet50", "mixed", 1, (32, 32), 0.125, False),  # bottlenecks, layouts change per layer
    ("digits_resnet", "w1a1-all", 3, (8, 8), 0.5, False),  # binary activations: float outputs
    ("apnn_vgg_variant", "w8a8", 2, (32, 32), 0.25, False),
]


@pytest.mark.parametrize("name,recipe,batch,size,width,stem", ZOO,
                         ids=[f"{c[0]}-{c[1]}" for c in ZOO])
def test_zoo_plans_bit_exact(name, recipe, batch, size, width, stem):
    plan, x = zoo_plan(name, recipe, batch, size, width)
    ex = GpuExecutor(with_launches(plan, PlanOptions(fuse_stem=stem)), "cpu")
    assert bool(ex.stems) == stem, ex.implementations()
    n = assert_matches_reference(plan, ex, x)
    assert n == len(plan.steps) - 1 + sum(isinstance(s, Layer) and len(s.outputs) - 1
                                          for s in plan.steps)


@pytest.mark.parametrize("name,size", [("resnet18", (32, 40)), ("alexnet", (64, 64))])
def test_fused_stem_image_never_shares_bytes_with_its_outputs(name, size):
    """A fused first layer reads the image at its own step, after the plan's Quantize step
    (the image's last reader in the plan): the arena keeps the image alive until then, so the
    stem's outputs cannot overwrite the pixels it is still reading (found on an H200: the
    stem then read its own outputs as non-finite pixels). The image outlives every step, so
    each replay of the forward reads the image it was given."""
    plan, _ = zoo_plan(name, "w1a2", 2, size, 0.125)
    ex = GpuExecutor(plan, "cpu")
    checked = 0
    for layer_name, q in ex.stems.items():
        layer = next(s for s in plan.layers if s.name == layer_name)
        lo = ex.arena.offsets[q.input]
        hi = lo + tensor_bytes(plan.tensors[q.input])
        for out in layer.outputs:
            o_lo = ex.arena.offsets[ex.arena.base(out)]
            o_hi = o_lo + tensor_bytes(plan.tensors[out])
            assert o_hi <= lo or hi <= o_lo, (out, (o_lo, o_hi), (lo, hi))
            checked += 1
    assert ex.stems and checked >= len(ex.stems)
    image = (ex.arena.offsets[plan.input],
             ex.arena.offsets[plan.input] + tensor_bytes(plan.tensors[plan.input]))
    for t in ex.arena.offsets:
        if t != plan.input and ex.arena.base(t) == t:
            a = ex.arena.offsets[t]
            assert a + tensor_bytes(plan.tensors[t]) <= image[0] or image[1] <= a, t


def test_forward_replays_new_inputs_and_reuses_memory():
    """The bound launches read the input buffer afresh: two forwards on new images equal the
    reference; tensors of disjoint lifetimes share arena bytes. The plan's biases are in
    accumulator units, so single-output layers run their kernel's own epilogue."""
    plan, x = zoo_plan("digits_resnet", "w2a2", 2, (8, 8), 0.5, exact_bias=False)
    ex = GpuExecutor(plan, "cpu")
    assert any("its own epilogue" in h for h in ex.implementations().values())
    ref = ReferenceExecutor(plan)
    checked = 0
    for seed in (11, 12):
        x2 = random_images(x.shape[0], tuple(x.shape[2:]), x.shape[1], seed=seed) * 1.5
        y = ex(x2)
        assert torch.equal(y, ref(x2))
        checked += 1
    assert checked == 2
    total = sum(tensor_bytes(plan.tensors[t]) for t in ex.arena.offsets)
    assert ex.arena.nbytes < total


def test_input_buffer_and_output_buffer_skip_the_copies():
    """An input written into `input_buffer` runs without the input copy (the buffer's bytes
    are never rewritten by the call), and copy_output=False hands back the engine's output
    buffer itself, which the next forward overwrites; the logits equal the copying path's."""
    plan, x = zoo_plan("digits_resnet", "w2a2", 2, (8, 8), 0.5, exact_bias=False)
    ex = GpuExecutor(plan, "cpu")
    ref = ReferenceExecutor(plan)
    buf = ex.input_buffer
    x1 = random_images(x.shape[0], tuple(x.shape[2:]), x.shape[1], seed=21)
    x2 = random_images(x.shape[0], tuple(x.shape[2:]), x.shape[1], seed=22)
    buf.copy_(x1)
    copies = []
    original = torch.Tensor.copy_

    def counting_copy(t, src, *a, **k):
        if t.data_ptr() == buf.data_ptr():
            copies.append(src)
        return original(t, src, *a, **k)

    torch.Tensor.copy_ = counting_copy
    try:
        y1 = ex(buf, copy_output=False)
        assert not copies
        assert y1.data_ptr() == ex.result.data_ptr()
        want1 = ref(x1)
        assert torch.equal(y1, want1)
        y2 = ex(x2)  # a foreign tensor is copied in; the output is a fresh copy
        assert len(copies) == 1
    finally:
        torch.Tensor.copy_ = original
    assert y2.data_ptr() != ex.result.data_ptr() and torch.equal(y2, ref(x2))
    assert torch.equal(y1, y2) and not torch.equal(y1, want1)  # y1 was the engine's buffer


def test_compiled_model_input_buffer():
    """CompiledModel passes the GPU executor's buffers through: `input_buffer` for the
    compiled shape, `run(copy_output=False)`; the reference executor has no such buffer."""
    q, _ = build_quantized("digits_resnet", "w2a2", image_size=(8, 8), width=0.5,
                           num_classes=10, seed=3, calib_batch=2)
    x = random_images(2, (8, 8), 1, seed=4)
    m = _compile(q, x, executor="gpu")
    m.input_buffer().copy_(x)
    y = m.run(m.input_buffer(), copy_output=False)
    assert torch.equal(y.clone(), m(x))
    with pytest.raises(ValueError, match="input_buffer needs the GPU executor"):
        _compile(q, x, executor="reference").input_buffer()


@pytest.mark.parametrize("reuse", [True, False])
def test_arena_never_overlaps_live_tensors(reuse):
    plan, _ = zoo_plan("resnet50", "mixed", 1, (32, 32), 0.125)
    arena = plan_arena(plan, reuse)
    life, aliases = lifetimes(plan)
    names = sorted(arena.offsets)
    pairs = 0
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (a0, a1), (b0, b1) = life[a], life[b]
            if reuse and (a1 < b0 or b1 < a0):
                continue
            ra = (arena.offsets[a], arena.offsets[a] + tensor_bytes(plan.tensors[a]))
            rb = (arena.offsets[b], arena.offsets[b] + tensor_bytes(plan.tensors[b]))
            assert ra[1] <= rb[0] or rb[1] <= ra[0], (a, b)
            pairs += 1
    assert pairs > 20 and aliases  # the flatten is a view
    assert all(o % 256 == 0 for o in arena.offsets.values())


class Branchy(nn.Module):
    """Concatenations (whole 32-channel words first, then not), a dilated conv (a float
    fallback) and a ReLU on a float tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.a = nn.Sequential(nn.Conv2d(16, 32, 1), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(16, 40, 3, padding=1), nn.ReLU())
        self.dw = nn.Conv2d(72, 72, 3, padding=2, dilation=2)
        self.head = nn.Conv2d(216, 24, 1)
        self.fc = nn.Linear(24, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        a, b = self.a(x), self.b(x)
        y = torch.relu(self.dw(torch.cat([a, b], 1)))
        h = torch.cat([y, torch.cat([a, b], 1), torch.cat([b, a], 1)], 1)
        h = torch.relu(self.head(h))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1))


def test_concat_fallback_and_float_outputs():
    torch.manual_seed(0)
    q = lowbit.quantize(Branchy().eval(), weight_bits=2, act_bits=2)
    x = torch.randn(2, 3, 9, 11)
    lowbit.calibrate(q, [x])
    plan = _compile(q, x).plan
    ex = GpuExecutor(plan, "cpu")
    how = ex.implementations()
    assert any(isinstance(s, FloatFallback) for s in plan.steps)
    kinds = {how[s.name] for s in plan.steps if isinstance(s, Concat)}
    assert {"torch.cat", "torch.cat of bit-plane words",
            "bit-plane values concatenated (torch)"} <= kinds, kinds
    assert assert_matches_reference(plan, ex, x) == len(plan.tensors) - 1


def _fp16_where_int8(wl):
    """torch.fp16 for the 8-bit layers (the first conv and the classifier), else default."""
    if wl.a.bits == 8:
        return TORCH_FP16, "test: fp16"
    return choose_impl(wl)


def test_torch_fp16_layers_on_the_fp16_template():
    """"torch.fp16" layers run exactly on triton.conv2d_fp16 (a GEMM as a 1x1 conv), here
    under the interpreter."""
    q, _ = build_quantized("digits_cnn", "w4a4", image_size=(8, 8), width=0.5, num_classes=10,
                           seed=5, calib_batch=2)
    x = random_images(3, (8, 8), 1, seed=6)
    plan = _compile(q, x, choose_impl=_fp16_where_int8).plan
    fp16 = [s for s in plan.layers if s.impl == TORCH_FP16]
    assert len(fp16) == 2 and {type(s.workload) for s in fp16} == {ConvWorkload, GemmWorkload}
    ex = GpuExecutor(with_launches(plan, PlanOptions(fuse_stem=False)), "cpu",
                     kernels=interpreted_kernel)
    how = ex.implementations()
    assert all("triton.conv2d_fp16" in how[s.name] for s in fp16), how
    assert assert_matches_reference(plan, ex, x) > 5


@pytest.mark.parametrize("wl", [
    ConvWorkload(N=2, H=5, W=7, C=6, K=9, R=3, S=3, stride=2, pad=1, w="s8", a="u8"),
    GemmWorkload(M=3, N=11, K=2000, w="s8", a="u8")], ids=["conv", "gemm"])
def test_fp16_fallbacks_equal_reference(wl):
    """Beyond the fp16 template's 2^24 bound a "torch.fp16" layer runs in float64 (exact to
    2^53); within it on the template. Both equal `lowbit.reference.run`."""
    kernel, how = fp16_kernel(wl)
    big = wl.gemm_shape[2] * 255 * 128 >= 2**24
    assert isinstance(kernel, Float64Kernel) == big, how
    checked = 0
    for seed in (1, 2):
        xv, w, params = random_inputs(wl, seed)
        assert torch.equal(kernel(xv, w, params), run(wl, xv, w, params))
        checked += 1
    assert checked == 2


def triton_int8(wl):
    """A chooser: the Triton int8 implicit GEMM (conv or GEMM) wherever it runs the layer."""
    name = "triton.conv2d_int8" if isinstance(wl, ConvWorkload) else "triton.gemm_int8"
    if unsupported_reason(name, wl) is None:
        return name, "test: triton int8"
    return choose_impl(wl)


def interpreted_int8_plan(model: str):
    q, _ = build_quantized(model, "w8a8-all", image_size=(8, 8), width=0.5, num_classes=10,
                           seed=7, calib_batch=2)
    x = random_images(2, (8, 8), 1, seed=8)
    return _compile(q, x, choose_impl=triton_int8).plan, x


def test_interpreted_int8_templates_through_the_executor():
    """The Triton int8 conv template (interpreted) serves the 8-bit layers it supports."""
    plan, x = interpreted_int8_plan("digits_cnn")
    served = [s for s in plan.layers if s.impl.startswith("triton.")]
    # the first conv (signed input) and the layers after ReLU (u8, through the zero point)
    assert len(served) == len([s for s in plan.layers if s.workload.a.bits == 8]) >= 3
    assert any(s.workload.a.encoding.value == "unsigned" for s in served)
    ex = GpuExecutor(plan, "cpu", kernels=interpreted_kernel)
    assert assert_matches_reference(plan, ex, x) > 5


def test_interpreted_gemv_convs_through_the_executor():
    """The default policy at batch 2 on 8x8 digits: the 3x3 convs of <= 64 output pixels
    (the block end with its residual included) run the weight-streaming GEMV (interpreted):
    a single requantized output in its own epilogue, the block end's accumulator through the
    separate pass; every tensor equal to the reference."""
    q, _ = build_quantized("digits_resnet", "w8a8-all", image_size=(8, 8), width=0.5,
                           num_classes=10, seed=7, calib_batch=2)
    x = random_images(2, (8, 8), 1, seed=8)
    plan = _compile(q, x).plan
    gemv = [s for s in plan.layers if s.impl == "triton.gemv_int8" and s.op == "conv2d"]
    assert gemv and any(s.residual for s in gemv)
    ex = GpuExecutor(plan, "cpu", kernels=interpreted_kernel)
    runs = {b.step.name: b.how for b in ex.steps
            if getattr(b.step, "impl", "") == "triton.gemv_int8"}
    assert len(runs) > len(gemv)  # and the classifier
    assert all("netops epilogue" in runs[s.name] for s in gemv if s.residual)
    assert assert_matches_reference(plan, ex, x) > 5


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "separate_pass"])
def test_interpreted_int8_block_ends_write_their_outputs(fuse):
    """A residual network at w8a8 on the interpreted Triton int8 templates: the block ends
    (two outputs and a residual) run their layer epilogue inside the kernel
    (`kernels.triton.conv_outputs`) or in the separate pass, with the same integers."""
    plan, x = interpreted_int8_plan("digits_resnet")
    ex = GpuExecutor(with_launches(plan, PlanOptions(fuse_outputs=fuse)), "cpu",
                     kernels=interpreted_kernel)
    fused = [b for b in ex.steps if "layer epilogue fused" in b.how]
    passes = [b for b in ex.steps if "netops epilogue" in b.how]
    assert (len(fused) >= 2 and not passes) if fuse else (passes and not fused)
    assert any(b.step.residual for b in fused + passes)
    assert assert_matches_reference(plan, ex, x) > 5


@pytest.mark.parametrize("name,recipe,size", [("vgg16", "w1a2", (32, 32)),
                                              ("vgg16", "w8a8", (32, 32)),
                                              ("alexnet", "w1a2", (64, 64))])
def test_pooled_layers_requantize_in_the_kernel_then_pool(name, recipe, size):
    """A max-pooled layer with one requantized output: its kernel writes the full-size
    requantized tensor (bit planes or bytes) and a max-pool of that tensor follows, the
    reference's order, instead of an int32 accumulator, an int32 pool and the epilogue pass."""
    plan, x = zoo_plan(name, recipe, 1, size, 0.125)
    ex = GpuExecutor(plan, "cpu")
    pooled = [b for b in ex.steps if isinstance(b.step, Layer) and b.step.pool is not None
              and b.step.name not in ex.stems]
    assert len(pooled) >= 2
    for b in pooled:
        assert b.step.workload.epilogue.requantizes, b.how
        assert b.how.endswith("(its own epilogue) + max-pool") and len(b.launches) == 2, b.how
    assert assert_matches_reference(plan, ex, x) > len(pooled)


def test_input_checks_before_any_launch():
    plan, x = zoo_plan("digits_resnet", "w1a1-all", 3, (8, 8), 0.5)
    ex = GpuExecutor(plan, "cpu")
    launched = []
    for b in ex.steps:
        b.launches = [lambda f=f: (launched.append(1), f())[1] for f in b.launches]
    with pytest.raises(ValueError, match="input shape"):
        ex(x[:2])
    with pytest.raises(TypeError, match="floating-point"):
        ex(x.to(torch.int32))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        ex(x.numpy())
    assert not launched
    bad = x.clone()
    bad[1, 0, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        ex(bad)
    assert torch.equal(ex(x), ReferenceExecutor(plan)(x))  # the flag resets per forward
