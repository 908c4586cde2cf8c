"""A plan as a readable table (rich): one row per step, then the totals."""

from __future__ import annotations

import io
import math

from rich.console import Console
from rich.table import Table

from .ir import AvgPool, FloatFallback, Layer, MaxPool, Plan, Quantize, Step, layer_weight_bytes
from .stem_choice import stem_text


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _op(step: Step) -> str:
    if isinstance(step, Layer):
        wl = step.workload
        if step.op == "conv2d":
            return f"conv {wl.R}x{wl.S}/{wl.stride} {wl.C}->{wl.K}"
        return f"linear {wl.K}->{wl.N}"
    if isinstance(step, MaxPool):
        return f"maxpool {step.window.kernel}/{step.window.stride}"
    if isinstance(step, AvgPool):
        return f"avgpool {step.mode}" + (f" {step.kernel}/{step.stride}" if step.kernel else "")
    if isinstance(step, FloatFallback):
        return f"float: {step.op}"
    return step.kind


def kernel_text(step: Layer) -> str:
    """The step's kernel as the plan fixed it: launch kind, config and where it comes from."""
    if step.stem:
        return stem_text(step)
    launch = [w for w, on in (("outputs in kernel", step.outputs_in_kernel),
                              ("chained", step.chained)) if on]
    cfg = "" if step.config is None else " ".join(f"{k}={v}" for k, v in step.config.items())
    source = step.config_source + (f" ({step.config_reason})" if step.config_reason else "")
    return "; ".join(x for x in (source, cfg, ", ".join(launch)) if x)


def _why(step: Step) -> str:
    if isinstance(step, Layer):
        return f"{step.impl}: {step.impl_reason}"
    if isinstance(step, FloatFallback):
        return f"PyTorch float: {step.reason}"
    if isinstance(step, Quantize):
        return "quantize_float" + (" (relu)" if step.relu else "")
    return ""


def plan_table(plan: Plan, width: int = 200) -> str:
    """The plan's steps (op, shapes, precisions in -> out, implementation and why, fused ops,
    weight and output bytes) and totals, as text."""
    t = Table(title=f"lowbit plan: input {list(plan.input_spec.shape)}, {len(plan.steps)} steps",
              show_lines=False)
    for col in ("#", "step", "op", "shape in -> out", "in -> out", "impl / why",
                "kernel config (source)", "fused", "weights", "out bytes"):
        t.add_column(col, overflow="fold")
    for i, step in enumerate(plan.steps):
        ins = [plan.tensors[n] for n in step.inputs]
        outs = [plan.tensors[n] for n in step.outputs]
        shape_in = "x".join(map(str, ins[0].shape)) if ins else ""
        shape_out = "x".join(map(str, outs[0].shape)) if outs else ""
        precs = f"{', '.join(x.kind for x in ins)} -> {', '.join(x.kind for x in outs)}"
        wbytes = _bytes(layer_weight_bytes(step, plan.params[step.weight])) \
            if isinstance(step, Layer) else ""
        fused = ", ".join(step.fused) if isinstance(step, Layer) else ""
        kernel = kernel_text(step) if isinstance(step, Layer) else ""
        t.add_row(str(i), step.name, _op(step), f"{shape_in} -> {shape_out}", precs,
                  _why(step), kernel, fused, wbytes, _bytes(sum(x.nbytes for x in outs)))
    fp16_weights = 2 * sum(math.prod(plan.params[s.weight].shape) for s in plan.layers)
    counts = {}
    for s in plan.steps:
        counts[s.kind] = counts.get(s.kind, 0) + 1
    buf = io.StringIO()
    console = Console(file=buf, width=width, record=False, force_terminal=False)
    console.print(t)
    sources = {}
    for s in plan.layers:
        sources[s.config_source or "-"] = sources.get(s.config_source or "-", 0) + 1
    console.print(f"steps: {', '.join(f'{k} {v}' for k, v in counts.items())}; "
                  f"float fallbacks: {len(plan.fallbacks)}; kernel configs: "
                  + ", ".join(f"{k} {v}" for k, v in sorted(sources.items())))
    console.print(f"weights: {_bytes(plan.weight_bytes())} (fp16: {_bytes(fp16_weights)}); "
                  f"peak activations: {_bytes(plan.peak_activation_bytes())}")
    return buf.getvalue()
