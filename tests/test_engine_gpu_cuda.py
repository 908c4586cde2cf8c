"""The GPU executor on a GPU (`gpu` mark): whole zoo networks at the issue's precisions, each
forward a CUDA-graph replay on fresh images, every integer tensor the graph writes equal to
the reference executor's (run on the same GPU) bit for bit, the logits too (hence the top-1).
The arena is poisoned first, so a tensor no launch wrote cannot pass. Cases are in priority
order and the first ones use the benchmark's shapes (kernels compile once for both);
benchmarks/gpu_session.sh selects them with -k.
"""

from __future__ import annotations

import warnings
from functools import cache

import pytest
import torch

from lowbit.bench import build_quantized, compile_plan, random_images
from lowbit.graph import TORCH_FP16, choose_impl, int8_preferring
from lowbit.graph.launches import PlanOptions, with_launches
from lowbit.runtime.compiled import compile_model
from lowbit.runtime.engine import ReferenceExecutor
from lowbit.runtime.gpu import GpuExecutor

pytestmark = pytest.mark.gpu

CASES = [  # (model, recipe, batch, image size)
    ("resnet18", "w1a2", 8, 224),
    ("vgg16", "w1a2", 8, 224),
    ("alexnet", "w1a2", 8, 224),
    ("resnet50", "w8a8", 4, 224),
    ("resnet50", "w1a2", 2, 160),
    ("resnet18", "mixed", 3, 96),
    ("resnet34", "w2a2", 2, 128),
    ("resnet18", "w4a4", 4, 224),
    ("apnn_vgg_variant", "w1a2", 8, 32),
    ("alexnet", "w8a8", 2, 224),
]


@cache
def plan_for(name: str, recipe: str, batch: int, size: int, chooser=None):
    q, _ = build_quantized(name, recipe, image_size=size, seed=1, device="cuda")
    x = random_images(batch, size, seed=2, device="cuda")
    if chooser is None:
        return compile_plan(q, x)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compile_model(q, x, executor="reference", choose_impl=chooser).plan


def check_replay(plan, **options) -> int:
    """Capture on one batch, replay on another; compare every tensor the graph wrote."""
    if options:
        plan = with_launches(plan, PlanOptions(**options))
    ex = GpuExecutor(plan, "cuda", reuse_memory=False)
    ex.memory.fill_(0x5A)
    n, c, h, w = plan.input_spec.shape
    ex(random_images(n, (h, w), c, seed=3, device="cuda"))  # warm-up + capture
    assert ex.graph is not None
    x = random_images(n, (h, w), c, seed=4, device="cuda") * 1.3
    y = ex(x)
    y_ref, ref = ReferenceExecutor(plan, "cuda")(x, record=True)
    skipped = {t for b in ex.steps if b.record_only for t in b.step.outputs}
    checked = 0
    for name, want in ref.items():
        if name in skipped:
            continue
        have = ex.buffers[name]
        assert have.dtype == want.dtype and have.shape == want.shape, name
        assert torch.equal(have, want), f"{name}: {(have != want).sum().item()} differ"
        checked += 1
    assert torch.equal(y, y_ref)
    assert torch.equal(y.argmax(1), y_ref.argmax(1))
    return checked


@pytest.mark.parametrize("name,recipe,batch,size", CASES,
                         ids=[f"{c[0]}-{c[1]}-b{c[2]}" for c in CASES])
def test_network_bit_exact_under_graph_replay(name, recipe, batch, size):
    plan = plan_for(name, recipe, batch, size)
    assert check_replay(plan) >= len(plan.layers)


def test_unchained_bitserial_layers():
    """The bit-serial layers launched without programmatic dependent launch (the engine chains
    them by default: every other test here runs chained), captured in the graph."""
    plan = plan_for("resnet18", "w1a2", 8, 224)
    assert check_replay(plan, chain=False) >= len(plan.layers)


@pytest.mark.parametrize("name,batch,size", [("resnet18", 8, 224), ("resnet50", 2, 160)])
def test_unfused_stem_and_record_mode(name, batch, size):
    """The first layer through its conv template + epilogue (no stem fusion; ResNet-50's has
    one 2-bit output, so its int8 kernel writes it and a bit-plane max-pool follows), and
    record=True on an executor that reuses memory."""
    plan = plan_for(name, "w1a2", batch, size)
    assert check_replay(plan, fuse_stem=False) >= len(plan.layers)
    ex = GpuExecutor(plan, "cuda")
    x = random_images(batch, size, seed=5, device="cuda")
    y, got = ex(x, record=True)
    y_ref, want = ReferenceExecutor(plan, "cuda")(x, record=True)
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert torch.equal(y, y_ref) and torch.equal(ex(x), y_ref)


IGEMM_FIRST = int8_preferring("triton.conv2d_int8")


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "separate_pass"])
def test_int8_triton_layers_with_their_layer_epilogue(fuse):
    """ResNet-50 w8a8 on the Triton implicit-GEMM int8 kernels (u8 activations through the
    zero point): block ends write their outputs from the kernel, or through the pass."""
    plan = plan_for("resnet50", "w8a8", 2, 128, IGEMM_FIRST)
    assert sum(s.impl == "triton.conv2d_int8" for s in plan.layers) > 40
    assert check_replay(plan, fuse_outputs=fuse) >= len(plan.layers)


def _fp16_8bit(wl):
    return (TORCH_FP16, "test") if wl.a.bits == 8 else choose_impl(wl)


def test_torch_fp16_layers_exact():
    plan = plan_for("resnet18", "w2a2", 2, 64, _fp16_8bit)
    assert sum(s.impl == TORCH_FP16 for s in plan.layers) == 2
    assert check_replay(plan, fuse_stem=False) >= len(plan.layers)


def test_nonfinite_input_raises_after_replay():
    plan = plan_for("resnet18", "w1a2", 8, 224)
    ex = GpuExecutor(plan, "cuda")
    x = random_images(8, 224, seed=6, device="cuda")
    y = ex(x)
    x[3, 1, 7, 9] = float("inf")
    with pytest.raises(ValueError, match="non-finite"):
        ex(x)
    x[3, 1, 7, 9] = 0.0
    with pytest.raises(ValueError, match="input shape"):
        ex(x[:4])
    with pytest.raises(ValueError, match="executor on"):
        ex(x.cpu())
    assert torch.equal(ex(random_images(8, 224, seed=6, device="cuda")), y)


def test_compile_follows_the_example_device():
    """A converted model left on the CPU compiles for a CUDA example (the copy moves to the
    example's device) and gives the reference executor's logits; the user's model stays put."""
    import lowbit

    q, _ = build_quantized("resnet18", "w1a2", image_size=64, seed=1)
    model = lowbit.convert(q)
    x = random_images(4, 64, seed=2, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = lowbit.compile(model, x)
    y = compiled(x)
    assert y.device.type == "cuda"
    assert {t.device.type for t in model.state_dict().values()} == {"cpu"}
    assert torch.equal(y, ReferenceExecutor(compiled.plan_for(tuple(x.shape)), "cuda")(x))


def test_resnet50_w8a8_one_integer_semantics_on_the_gpu():
    """Fake-quant eval == convert == compile (reference) == compile (GPU) on ResNet-50 w8a8
    with the 8-bit residual stream at 32 x 32: the fake-quant model and `convert` run in
    float64 agree to its rounding, the GPU executor equals the plan's reference executor bit
    for bit, and both equal `convert` to their float32 output."""
    import copy

    import lowbit

    q, _ = build_quantized("resnet50", "w8a8", image_size=32, residual_bits=8, seed=0)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = lowbit.convert(q).double()(x.double())
        fake = copy.deepcopy(q).double().eval()(x.double())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = compile_model(q.cuda(), x.cuda(), records=False)
    assert cm.executor == "gpu"
    y_gpu = cm(x.cuda()).cpu()
    y_ref = ReferenceExecutor(cm.plan, "cpu")(x)
    top = float(want.abs().max())
    assert float((fake - want).abs().max()) <= 1e-12 * top
    assert torch.equal(y_gpu, y_ref)
    assert float((y_ref.double() - want).abs().max()) <= 2**-20 * top
