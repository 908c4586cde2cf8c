"""The model matrix: torchvision classifiers (random weights, small widths and inputs, batch 2;
`tv_models`) quantized through the public API (w8a8; w2a2 with the first and last layer at
w8a8), calibrated and compiled. Each compiles; every fake-quant conv / linear is an integer
layer of the plan (but ConvNeXt's linears on NHWC maps); each says which ops left the integer
path and why, and the reasons are exactly the expected kinds; the reference executor's logits
follow the fake-quant model (fp16 fallbacks in between: within FALLBACK_RTOL). The GPU
executor equals the reference on a GPU (`gpu` marker). Depthwise and grouped convs run on
their own integer kernels."""

from __future__ import annotations

import re

import pytest
import torch

import lowbit
from any_cnn_cases import compiled, quantized
from lowbit.graph.summary import plan_table
from lowbit.runtime.engine import ReferenceExecutor
from tv_models import MODELS, tv

GROUPED, BN, ACT_IN, ACT_READ, DEQUANT, PRODUCT, CLAMP, RELU, CEIL, NORM, PERMUTE, LINEAR4D, \
    CONSTANT, ADD = ("grouped conv", "batchnorm after a float op", "activation of a float input",
                     "activation read in float", "dequantized for a float reader",
                     "product in float", "clamp in float", "relu in float", "ceil_mode pool",
                     "layernorm", "permute", "linear on NHWC", "tensor constants", "float add")
_KINDS = [
    (GROUPED, r"^float Conv2d \(groups=\d+: no integer conv\)$"),
    (BN, r"^BatchNorm not directly after a fake-quant conv/linear"),
    (ACT_IN, r"its input is not quantized in the model"),
    (ACT_READ, r" of a value read in float$"),
    (DEQUANT, r"^a float reader of a quantized value$"),
    (PRODUCT, r"^product of values not quantized in the model"),
    (CLAMP, r"^clamp of a float tensor$"),
    (RELU, r"^ReLU of a float tensor$"),
    (CEIL, r"^MaxPool2d with ceil_mode / return_indices: no integer pool$"),
    (NORM, r"^LayerNorm has no integer form$"),
    (PERMUTE, r"permute in .* has no integer form$"),
    (LINEAR4D, r"^linear layer on a 4-d input"),
    (CONSTANT, r"^reads tensor constants"),
    (ADD, r"^add whose operands are no conv/linear output"),
]
#: the kinds of fallback reasons each model has today
EXPECTED: dict[str, set[str]] = {
    "resnet": set(), "wide_resnet": set(), "vgg": set(), "alexnet": set(), "resnext": set(),
    "regnet_x": set(), "shufflenet_v2": set(), "mnasnet": set(), "mobilenet_v2": set(),
    "efficientnet_b0": set(), "efficientnet_b1": set(), "efficientnet_b2": set(),
    "efficientnet_b3": set(), "regnet_y": set(), "mobilenet_v3_small": set(),
    "mobilenet_v3_large": set(), "densenet": set(), "squeezenet": set(), "googlenet": set(),
    "convnext": {NORM, PERMUTE, LINEAR4D, CONSTANT, DEQUANT, ACT_READ, ADD},
}
#: fake-quant layers that stay float: ConvNeXt's pointwise linears read NHWC maps
FLOAT_LAYERS = {"convnext": 6}
#: the heaviest models on 2 CPU cores (GoogLeNet: 58 convs at full width; the deeper
#: EfficientNets, MobileNet-V3-Large, Wide-ResNet, MNASNet: 20-70 s each there)
SLOW = {"googlenet", "efficientnet_b1", "efficientnet_b2", "efficientnet_b3",
        "mobilenet_v3_large", "wide_resnet", "mnasnet"}
#: the low-bit (w2a2) cases (the tiny squeeze-excite convs of the small RegNet-Y / MNASNet
#: see only zeros at 2 bits on two random images: no scale)
LOW_BIT = ("resnet", "mobilenet_v2", "efficientnet_b0", "shufflenet_v2", "regnet_x",
           "densenet")
#: the low-bit cases of the GPU test: MobileNet-V3-Small's squeeze-excite over a ReLU map
#: too (its 8-bit map written by a 2-bit layer; 14 s on 2 CPU cores, so not in the CPU tier)
GPU_LOW_BIT = (*LOW_BIT, "mobilenet_v3_small")
#: logits against the fake-quant model: integer only (a level flipped at a float32 rounding
#: tie of the fake-quant model propagates through the layers after it: a few 1e-3), with fp16
#: fallbacks in between
INTEGER_RTOL, FALLBACK_RTOL = 2e-2, 5e-2


def kind(reason: str) -> str:
    for name, pattern in _KINDS:
        if re.search(pattern, reason):
            return name
    return reason


def _params(names):
    return [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in names]


def _build(name: str, recipe: str = "w8a8"):
    make, size = MODELS[name]
    torch.manual_seed(0)
    model = make()
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    q = quantized(model, x, recipe)
    return q, x


@pytest.mark.parametrize("name", _params(MODELS))
def test_matrix_model_compiles_with_its_reasons(name):
    q, x = _build(name)
    plan = compiled(q, x).plan
    kinds = {kind(s.reason) for s in plan.fallbacks}
    assert kinds == EXPECTED[name], sorted(kinds ^ EXPECTED[name])
    n_quant = len(lowbit.quant.quant_layers(q))
    assert len(plan.layers) == n_quant - FLOAT_LAYERS.get(name, 0)
    assert f"float fallbacks: {len(plan.fallbacks)}" in plan_table(plan)
    y = ReferenceExecutor(plan)(x)
    with torch.no_grad():
        yf = q(x)
    tol = FALLBACK_RTOL if plan.fallbacks else INTEGER_RTOL
    assert float((y - yf).abs().max()) <= tol * float(yf.abs().max())


#: the first layer's (filter, stride) per matrix model whose first conv the fused stem runs
#: (the matrix's VGG pools its first conv 2x2: not the stem's 3x3/2 pool)
STEM_FIRST = {"resnet": (7, 2), "mobilenet_v2": (3, 2), "regnet_x": (3, 2),
              "efficientnet_b0": (3, 2)}


@pytest.mark.parametrize("name", [n for n in STEM_FIRST if n not in SLOW])
def test_matrix_first_layers_on_the_fused_stem(name):
    """The plan fuses the image's quantization into the first conv (`graph.launches`) on
    ResNet's 7x7/2 and the 3x3/2 of MobileNet, RegNet and EfficientNet."""
    q, x = _build(name)
    first = compiled(q, x).plan.layers[0]
    assert (first.workload.R, first.workload.stride) == STEM_FIRST[name]
    assert first.stem, first.name


@pytest.mark.parametrize("name", _params(LOW_BIT))
def test_matrix_low_bit(name):
    """w2a2 (first and last layer w8a8): bit-serial layers, same reasons."""
    q, x = _build(name, "w2a2")
    plan = compiled(q, x).plan
    assert {kind(s.reason) for s in plan.fallbacks} <= EXPECTED[name]
    assert any(s.workload.a.bits == 2 for s in plan.layers)
    y = ReferenceExecutor(plan)(x)
    assert bool(torch.isfinite(y).all())


@pytest.mark.gpu
@pytest.mark.parametrize("name,recipe", [(n, "w8a8") for n in MODELS]
                         + [(n, "w2a2") for n in GPU_LOW_BIT])
def test_matrix_gpu_executor_equals_reference(name, recipe):
    """Batch 2 on the GPU: the GPU executor's logits and every tensor it writes equal the
    reference executor's on the same GPU (fp16 fallbacks run the same modules there)."""
    from lowbit.runtime.gpu import GpuExecutor

    torch.backends.cudnn.deterministic = True
    q, x = _build(name, recipe)
    x = x.cuda()
    plan = compiled(q.cuda(), x).plan
    y, rec = GpuExecutor(plan, x.device)(x, record=True)
    y_ref, rec_ref = ReferenceExecutor(plan, x.device)(x, record=True)
    assert torch.equal(y, y_ref)
    for t, v in rec_ref.items():
        assert torch.equal(rec[t], v), t


def test_torchvision_imports_beside_this_torch():
    models = tv()
    assert callable(models.get_model_builder("mobilenet_v2"))


def test_bench_loads_torchvision_and_file_models(tmp_path):
    """`lowbit bench`'s models: 'tv:NAME' and 'path.py:fn' quantized and calibrated on the
    CPU by the bench harness (the timing itself needs a GPU)."""
    from lowbit.bench import build_quantized
    from lowbit.runtime.model_source import external_model, file_model

    tv()
    q, _ = build_quantized("tv:squeezenet1_1", "w8a8", image_size=32, num_classes=10,
                                     calib_batch=2)
    assert len(lowbit.quant.quant_layers(q)) == 26
    file = tmp_path / "net.py"
    file.write_text("from torch import nn\n\n"
                    "def build(num_classes=1000):\n"
                    "    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(),\n"
                    "                         nn.LazyLinear(num_classes))\n")
    m = file_model(f"{file}:build", num_classes=7)
    assert m[-1].out_features == 7
    assert isinstance(external_model(f"{file}:build", 5), torch.nn.Module)
    with pytest.raises(ValueError, match="has no function 'missing'"):
        file_model(f"{file}:missing")
    with pytest.raises(ValueError, match=r"path\.py:function"):
        file_model("net.txt")
    with pytest.raises(ValueError, match="torchvision has no model 'nonet'"):
        external_model("tv:nonet")


def test_bench_cli_names_the_model_forms():
    from typer.testing import CliRunner

    from lowbit.cli import USER_ERROR, app

    for args in (["nonet"], ["tv:mobilenet_v2", "--image-size", "-1"]):
        r = CliRunner().invoke(app, ["bench", *args])
        assert r.exit_code == USER_ERROR and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["bench", "nonet"])
    assert "tv:NAME" in r.output and "path.py:function" in r.output
