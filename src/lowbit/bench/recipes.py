"""Precision recipes and the quantized zoo models the network benchmark times
(`lowbit bench`, `lowbit tune --model`, benchmarks/network.py).

- `build_quantized(name, recipe, ...)`: the zoo model (`lowbit.models`), or a torchvision
  model 'tv:NAME' / a file's 'path.py:fn' (`lowbit.runtime.model_source`), quantized by a
  precision recipe and calibrated on random images. Recipes: "wXaY" (every conv / linear at
  X-bit weights and Y-bit activations except the first conv and the last linear at w8a8),
  "wXaY-all" (every layer), "mixed" (first / last w8a8, the others cycling through w1a2,
  w2a2, w4a4, w8a8: every kind of layout change between layers).
- `compile_plan`: the plan of a quantized model for an input's shape; `impl_chooser`: the
  per-layer implementation policies by name; `network_workloads`: a network's distinct
  kernel workloads as the engine plans them.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ..graph.impl import ImplChooser
from ..graph.ir import Plan
from ..graph.launches import PlanOptions
from ..runtime.model_source import external_model, is_external

#: zoo networks a recipe runs on, with their default input size
IMAGE_SIZE = {"resnet18": 224, "resnet34": 224, "resnet50": 224, "vgg16": 224,
              "alexnet": 224, "apnn_vgg_variant": 32, "digits_resnet": 8, "digits_cnn": 8}
#: the per-layer (weight bits, activation bits) the 'mixed' recipe cycles through
MIX_CYCLE = ((1, 2), (2, 2), (4, 4), (8, 8))


def conv_linear_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if type(m) in (nn.Conv2d, nn.Linear)]


def parse_recipe(recipe: str) -> tuple[int | None, int | None, bool]:
    """'w1a2' -> (1, 2, False); 'w4a4-all' -> (4, 4, True); 'mixed' -> (None, None, False)."""
    if recipe == "mixed":
        return None, None, False
    body, _, suffix = recipe.partition("-")
    try:
        if body[0] != "w" or "a" not in body or suffix not in ("", "all"):
            raise ValueError
        w, a = body[1:].split("a")
        bits = int(w), int(a)
    except ValueError:
        raise ValueError(f"recipe must be 'wXaY', 'wXaY-all' or 'mixed', got {recipe!r}") \
            from None
    if not all(1 <= b <= 8 for b in bits):
        raise ValueError(f"recipe bits must be in 1..8, got {recipe!r}")
    return bits[0], bits[1], suffix == "all"


def recipe_layers(model: nn.Module, recipe: str) -> tuple[int, int, dict[str, dict]]:
    """(weight_bits, act_bits, per-layer overrides) of `lowbit.quantize` for a recipe."""
    w, a, every = parse_recipe(recipe)
    names = conv_linear_names(model)
    eight = {"weight_bits": 8, "act_bits": 8}
    if w is None:
        layers = {n: dict(zip(("weight_bits", "act_bits"), MIX_CYCLE[i % len(MIX_CYCLE)],
                              strict=True)) for i, n in enumerate(names[1:-1])}
        layers.update({names[0]: eight, names[-1]: eight})
        return 1, 2, layers
    return w, a, ({} if every or len(names) < 2 else {names[0]: eight, names[-1]: eight})


def randomize_batchnorms(model: nn.Module, seed: int, negative: float = 0.0) -> None:
    """Random running statistics and affine parameters (a fraction `negative` of the gammas
    below 0), so that folding does something."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                k = m.num_features
                m.running_mean.copy_(torch.randn(k, generator=g) * 0.3)
                m.running_var.copy_(torch.rand(k, generator=g) + 0.5)
                gamma = torch.rand(k, generator=g) + 0.5
                flip = torch.rand(k, generator=g) < negative
                m.weight.copy_(torch.where(flip, -gamma, gamma))
                m.bias.copy_(torch.randn(k, generator=g) * 0.2)


def random_images(batch: int, size: int | tuple[int, int], channels: int = 3, seed: int = 0,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    hw = (size, size) if isinstance(size, int) else tuple(size)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, channels, *hw, generator=g).to(device)


def build_quantized(name: str, recipe: str, *, image_size: int | tuple[int, int] | None = None,
                    width: float = 1.0, num_classes: int = 1000, seed: int = 0,
                    calib_batch: int = 4, device: torch.device | str = "cpu",
                    residual_bits: int | None = None,
                    **options: object) -> tuple[nn.Module, nn.Module]:
    """(fake-quant model calibrated on `calib_batch` random images, the float model it came
    from), both on `device` in eval mode; residual_bits as `lowbit.quantize`'s. Options go
    to `lowbit.models.get`."""
    import lowbit.models as zoo

    from ..quant.api import quantize_model
    from ..quant.calibrate import calibrate

    torch.manual_seed(seed)
    model = external_model(name, num_classes) if is_external(name) else zoo.get(
        name, num_classes=num_classes, width=width, **options).eval()
    randomize_batchnorms(model, seed)
    w, a, layers = recipe_layers(model, recipe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = quantize_model(model, weight_bits=w, act_bits=a, layers=layers,
                           residual_bits=residual_bits)
    model, q = model.to(device), q.to(device).eval()
    channels = 1 if name.startswith("digits") else 3
    size = image_size or IMAGE_SIZE.get(name, 224)
    calibrate(q, [random_images(calib_batch, size, channels, seed + 1, device)])
    return q, model


def compile_plan(q: nn.Module, x: torch.Tensor, exact_bias: bool = True, wide_bits: int = 24,
                 chooser: str = "default", options: PlanOptions | None = None,
                 records: str | bool | None = False) -> tuple[Plan, str]:
    """The plan of `q` for x's shape, traced on x's device; if that fails, traced on the CPU
    on two of x's images and planned for x's shape ((plan, where it was traced)).
    exact_bias=False: biases rounded to accumulator units (`lowbit.graph.build_plan`), which
    lets single-output layers use their kernel's own epilogue. wide_bits, options and records:
    as `lowbit.compile`'s (records: the tuned configs of the layers; False: the defaults).
    chooser: `impl_chooser`'s name."""
    import copy

    from ..graph import build_plan
    from ..runtime.compiled import compile_model

    choose = impl_chooser(chooser)
    kw = dict(executor="reference", wide_bits=wide_bits, chooser=choose, records=records,
              options=options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cm, where = compile_model(q, x, **kw), str(x.device)
        except Exception as e:  # the planner is exercised on the CPU: fall back to it
            where = f"cpu (on {x.device}: {type(e).__name__}: {e}"[:200] + ")"
            cm = compile_model(copy.deepcopy(q).cpu(), x[:2].cpu(), **kw)
        shape = tuple(x.shape)
        if exact_bias:
            return cm.plan_for(shape), where
        return build_plan(cm.dataflow, shape, cm.chooser, cm.wide_bits, exact_bias=False,
                          options=cm.options), where


def impl_chooser(name: str) -> str | ImplChooser:
    """The chooser called `name`: "default" (`lowbit.compile`'s measured policy), "model"
    (the performance model, `lowbit.graph.ModelChooser`), an int8 template's name (the
    default policy with that template tried first, `lowbit.graph.int8_preferring`), or "-"
    and one (the default policy without it, `lowbit.graph.impl.int8_without`)."""
    if name in ("default", "model"):
        return name
    from ..graph.impl import int8_preferring, int8_without

    if name.startswith("-"):
        return int8_without(name[1:])
    return int8_preferring(name)


def network_workloads(name: str, batch: int, precision: str, *,
                      image_size: int | tuple[int, int] | None = None
                      ) -> list[tuple[str, object]]:
    """The distinct kernel workloads of zoo network `name` at `batch` under a precision recipe
    (`parse_recipe`), as the engine would plan them: [(layer name, Workload)] in execution
    order, one entry per distinct workload (what `lowbit tune --model` tunes). Planned on the
    CPU from a model calibrated on two random images; no GPU needed."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    size = image_size or IMAGE_SIZE.get(name, 224)
    q, _ = build_quantized(name, precision, image_size=size, calib_batch=2)
    channels = 1 if name.startswith("digits") else 3
    from ..runtime.compiled import compile_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = compile_model(q, random_images(2, size, channels, seed=3), executor="reference")
    hw = (size, size) if isinstance(size, int) else tuple(size)
    plan = cm.plan_for((batch, channels, *hw))
    seen: dict[str, tuple[str, object]] = {}
    for step in plan.layers:
        if step.impl == "torch.fp16":
            continue
        seen.setdefault(step.workload.key, (step.name, step.workload))
    return list(seen.values())
