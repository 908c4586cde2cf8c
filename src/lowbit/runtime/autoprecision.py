"""Per-layer precision chosen by accuracy sensitivity and kernel time.

`autoprecision(model, data, budget_us=... | budget_bits=..., layer_time_us=...)` picks one
(weight bits, activation bits) pair per quantized layer among `precisions`:

1. Sensitivity: for every layer and precision, only that layer is quantized (the others stay
   float), its activation range is calibrated on the first `batches` batches, and the
   sensitivity is the mean KL divergence between the float model's and this model's output
   distributions (softmax of the logits) on those batches. The network-output KL measures what
   a layer's quantization does to the prediction; the total of a plan is taken as the sum over
   its layers (first-order additivity, as in HAWQ-style allocation).
2. Cost: the plan's predicted latency, the sum of `layer_time_us(workload)` over its layers
   (each layer's ConvWorkload / GemmWorkload at its precision, shapes from `data`'s first batch
   or `batch`), when `layer_time_us` is given (measured times from the tuning records, or
   `predicted_time_us()`: the performance model, the default for a `budget_us`); with a
   `budget_bits` or no time model, the parameter-weighted average weight bits.
3. The Pareto front of (cost, total sensitivity) over all plans, exact by dynamic programming
   over the layers (dominated partial plans pruned); the chosen plan is the least sensitive
   one within the budget. `evaluate(plan) -> accuracy` (optional; e.g. QAT then test accuracy)
   is called on the chosen plan and on the uniform plans, so the result can be compared with
   uniform precision.

The plan feeds `lowbit.quantize(model, layers=result.layers_option())`. The first / last layer
policy is quantize's (skip_first / skip_last keep them float). Measuring the chosen plan's
latency on a GPU (compile, CUDA-graph replay) is the engine's job and not done here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ..core import ConvWorkload, GemmWorkload, parse_wa
from ..quant.api import eligible_layers, quantize_model
from ..quant.calibrate import calibrate
from ..quant.modules import activation_precision, weight_precision

Plan = dict[str, tuple[int, int]]


@dataclass(frozen=True)
class PlanPoint:
    """One plan: {layer: (w_bits, a_bits)}, its cost (latency_us or avg_bits), summed
    sensitivity, parameter-weighted average weight bits, predicted latency (None without
    layer_time_us) and accuracy (None unless evaluated)."""

    plan: Plan
    cost: float
    sensitivity: float
    avg_bits: float
    latency_us: float | None
    accuracy: float | None = None


@dataclass(frozen=True)
class AutoPrecision:
    """Sensitivities and costs per (layer, precision), the Pareto front (cost ascending), the
    chosen plan and the uniform plans (precision -> point) for comparison."""

    layers: tuple[str, ...]
    precisions: tuple[str, ...]
    cost_unit: str
    sensitivity: dict[tuple[str, str], float]
    latency_us: dict[tuple[str, str], float] = field(repr=False)
    front: tuple[PlanPoint, ...] = field(repr=False)
    chosen: PlanPoint | None
    uniform: dict[str, PlanPoint] = field(repr=False)

    def layers_option(self, point: PlanPoint | None = None) -> dict[str, dict[str, int]]:
        """`lowbit.quantize(..., layers=...)` for `point` (default: the chosen plan)."""
        point = point or self.chosen
        if point is None:
            raise ValueError("no plan fits the budget: see result.front for the cheapest")
        return {n: {"weight_bits": w, "act_bits": a} for n, (w, a) in point.plan.items()}


def _batches(data: Iterable, n: int) -> list[torch.Tensor]:
    out = []
    for batch in data:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"data must yield tensors or (input, target) pairs, got "
                            f"{type(x).__name__}")
        out.append(x)
        if len(out) == n:
            break
    if not out:
        raise ValueError("data yielded no batches")
    return out


def _layer_inputs(model: nn.Module, names: list[str], x: torch.Tensor
                  ) -> dict[str, tuple[tuple[int, ...], bool]]:
    """{layer: (input shape, input has negatives)} on batch x."""
    seen, hooks = {}, []
    mods = dict(model.named_modules())
    for n in names:
        def hook(m: nn.Module, inp: tuple, n: str = n) -> None:
            seen[n] = (tuple(inp[0].shape), bool((inp[0] < 0).any()))
        hooks.append(mods[n].register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return seen


def layer_workload(layer: nn.Module, input_shape: tuple[int, ...], signed_input: bool,
                   w_bits: int, a_bits: int, batch: int | None = None
                   ) -> ConvWorkload | GemmWorkload:
    """The workload a Conv2d (NCHW input) or Linear layer runs at (w_bits, a_bits)."""
    w, a = weight_precision(w_bits), activation_precision(a_bits, signed_input)
    if isinstance(layer, nn.Conv2d):
        n, c, h, wd = input_shape
        return ConvWorkload(N=batch or n, H=h, W=wd, C=c, K=layer.out_channels,
                            R=layer.kernel_size[0], S=layer.kernel_size[1],
                            stride=layer.stride[0], pad=layer.padding[0], w=w, a=a)
    m = 1
    for d in input_shape[:-1]:
        m *= d
    if batch:
        m = m // input_shape[0] * batch
    return GemmWorkload(M=m, N=layer.out_features, K=layer.in_features, w=w, a=a)


def _output_kl(ref: list[torch.Tensor], model: nn.Module, xs: list[torch.Tensor]) -> float:
    model.eval()
    total = 0.0
    with torch.no_grad():
        for r, x in zip(ref, xs, strict=True):
            logp = F.log_softmax(model(x).float(), dim=-1)
            total += float(F.kl_div(logp, r, log_target=True, reduction="batchmean"))
    return total / len(xs)


def pareto_front(options: list[list[tuple[float, float, str]]]) -> list[tuple[float, float,
                                                                               tuple[str, ...]]]:
    """Exact 2-D Pareto front of picking one (cost, loss, label) per group, minimizing both
    sums: [(cost, loss, labels)], cost ascending, loss strictly descending."""
    front: list[tuple[float, float, tuple[str, ...]]] = [(0.0, 0.0, ())]
    for group in options:
        merged = sorted((c + gc, l + gl, (*labels, g)) for c, l, labels in front
                        for gc, gl, g in group)
        front = []
        for point in merged:
            if not front or point[1] < front[-1][1]:
                front.append(point)
    return front


def predicted_time_us(gpu: str | None = None) -> Callable[[ConvWorkload | GemmWorkload], float]:
    """`layer_time_us` from the performance model (`lowbit.tune.dispatch.choose`, no
    measurement): the predicted time of the fastest way to run a layer on `gpu` (default:
    this machine's GPU, else the H100) among our templates, over both input layouts (bit
    planes where both operands have <= 4 bits, one value per byte always), and cuDNN fp16."""
    from ..core import Layout
    from ..tune.dispatch import choose

    @functools.cache
    def time_us(workload: ConvWorkload | GemmWorkload) -> float:
        variants = [workload.replace(a_layout=Layout.INT8, w_layout=Layout.INT8)]
        if workload.w.bits <= 4 and workload.a.bits <= 4:
            variants.append(workload.replace(a_layout=Layout.BITPLANE,
                                             w_layout=Layout.BITPLANE))
        times = []
        for wl in variants:
            try:
                times.append(choose(wl, gpu).predicted_us)
            except ValueError:  # no template of ours and no fp16 for this layout
                continue
        if not times:
            raise ValueError(f"the performance model has no way to run {workload.key}")
        return min(times)

    return time_us


def autoprecision(model: nn.Module, data: Iterable, *, budget_us: float | None = None,
                  budget_bits: float | None = None,
                  layer_time_us: Callable[[ConvWorkload | GemmWorkload], float] | None = None,
                  precisions: Iterable[str] = ("w8a8", "w4a4", "w2a2", "w1a2"),
                  skip_first: bool = True, skip_last: bool = True, method: str = "max",
                  batches: int = 4, batch: int | None = None,
                  evaluate: Callable[[Plan], float] | None = None) -> AutoPrecision:
    """Choose every quantized layer's precision (module doc). `model`: the float model (eval
    mode is used). `data`: batches (x or (x, y)) for sensitivity. One budget: `budget_us`
    (latency; layer_time_us default: `predicted_time_us()`, the performance model's
    prediction for this GPU) or `budget_bits` (average weight bits; the front
    is then over bits, with each point's latency still predicted when layer_time_us is given);
    neither: the front only, over latency when layer_time_us is given. Returns the front, the
    chosen plan and the uniform plans."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if budget_us is not None and budget_bits is not None:
        raise ValueError("give one budget: budget_us or budget_bits, not both")
    if layer_time_us is not None and not callable(layer_time_us):
        raise TypeError(f"layer_time_us must be callable (workload) -> microseconds, got "
                        f"{layer_time_us!r}")
    if budget_us is not None and layer_time_us is None:
        layer_time_us = predicted_time_us()
    precisions = tuple(precisions)
    if not precisions:
        raise ValueError("precisions must name at least one 'wXaY' precision")
    pairs = {p: parse_wa(p) for p in precisions}
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise ValueError(f"batches must be an int >= 1, got {batches!r}")
    xs = _batches(data, batches)
    model = model.eval()
    plain = [n for n, _ in eligible_layers(model)]
    layers = plain[1 if skip_first else 0:len(plain) - 1 if skip_last else len(plain)]
    if not layers:
        raise ValueError("no layer left to choose a precision for (skip_first / skip_last)")
    mods = dict(model.named_modules())
    inputs = _layer_inputs(model, layers, xs[0])
    with torch.no_grad():
        ref = [F.log_softmax(model(x).float(), dim=-1) for x in xs]
    sens, times = {}, {}
    for name in layers:
        others = [n for n in plain if n != name]
        for p, (wb, ab) in pairs.items():
            q = quantize_model(model, wb, ab, method=method, skip=others)
            calibrate(q, xs)
            sens[name, p] = max(_output_kl(ref, q, xs), 0.0)
            if layer_time_us is not None:
                shape, signed = inputs[name]
                times[name, p] = float(layer_time_us(layer_workload(mods[name], shape, signed,
                                                                    wb, ab, batch)))
    params = {n: mods[n].weight.numel() for n in layers}
    total_params = sum(params.values())

    by_latency = layer_time_us is not None and budget_bits is None

    def cost(name: str, p: str) -> float:
        if by_latency:
            return times[name, p]
        return pairs[p][0] * params[name] / total_params

    def point(plan_precisions: tuple[str, ...]) -> PlanPoint:
        plan = {n: pairs[p] for n, p in zip(layers, plan_precisions, strict=True)}
        bits = sum(pairs[p][0] * params[n] for n, p in zip(layers, plan_precisions,
                                                           strict=True)) / total_params
        latency = sum(times[n, p] for n, p in zip(layers, plan_precisions, strict=True)) \
            if times else None
        return PlanPoint(plan, latency if by_latency else bits,
                         sum(sens[n, p] for n, p in zip(layers, plan_precisions, strict=True)),
                         bits, latency)

    front = tuple(point(labels) for _, _, labels in pareto_front(
        [[(cost(n, p), sens[n, p], p) for p in precisions] for n in layers]))
    limit = budget_us if budget_us is not None else budget_bits
    fits = [pt for pt in front if limit is None or pt.cost <= limit * (1 + 1e-12)]
    chosen = min(fits, key=lambda pt: pt.sensitivity) if fits and limit is not None else None
    uniform = {p: point(tuple(p for _ in layers)) for p in precisions}
    if evaluate is not None:
        def scored(pt: PlanPoint) -> PlanPoint:
            return PlanPoint(pt.plan, pt.cost, pt.sensitivity, pt.avg_bits, pt.latency_us,
                             float(evaluate(dict(pt.plan))))
        chosen = scored(chosen) if chosen is not None else None
        uniform = {p: scored(pt) for p, pt in uniform.items()}
    return AutoPrecision(tuple(layers), precisions,
                         "us" if by_latency else "avg weight bits", sens, times,
                         front, chosen, uniform)
