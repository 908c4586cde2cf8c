"""The exact reference executor of a plan: every step through `lowbit.reference` in int64.

`run_plan(plan, x)` returns the float result; with `record=True` also every tensor the plan
writes, quantized ones in their storage layout (int8 / uint8 bytes or int32 bit planes, as
`lowbit.quant.packing.pack` stores them) and float ones as float32: what the GPU executor is
compared against bit for bit. The step semantics are `lowbit.graph.ir`'s; the arithmetic is
`lowbit.reference.netops` (layer epilogue, pools, quantize_float) and
`lowbit.reference.accumulate` (exact conv / GEMM on integer values: bit-serial layers too,
their result is the same integers). Runs on the input's device.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from ..core import Precision
from ..graph.ir import (
    AvgPool,
    ChannelAffine,
    Concat,
    Flatten,
    FloatFallback,
    Gather,
    Layer,
    LayerOutput,
    Lookup,
    MaxPool,
    Output,
    Plan,
    Quantize,
    TableMul,
    TensorSpec,
    WidePrecision,
    parse_precision,
)
from ..graph.pools import GLOBAL, WINDOW, axis_windows
from ..quant.packing import pack
from ..quant.quantize import round_half_up
from ..reference import (
    FloatOutput,
    RequantizedOutput,
    accumulate,
    avgpool2d_int,
    epilogue_outputs,
    maxpool2d_int,
    quantize_float,
    requantize_int,
)
from ..reference.affine import channel_affine_int
from ..reference.image import quantize_uint8_image
from ..reference.netops import MULT_LIMIT, Y_LIMIT, round_shift_sum, table_mul_int


def _nhwc(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 2, 3, 1).contiguous() if x.dim() == 4 else x


def _nchw(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 3, 1, 2).contiguous() if x.dim() == 4 else x


def _requantize(q: torch.Tensor, m: torch.Tensor, s: torch.Tensor,
                prec: Precision | WidePrecision, relu: bool) -> torch.Tensor:
    """netops.requantize_int, also for 16 / 24-bit wide outputs (same formula)."""
    if isinstance(prec, Precision):
        return requantize_int(q, m, s, prec, relu)
    lo = max(prec.qmin, 0) if relu else prec.qmin
    return round_shift_sum([q * m], s.expand(q.shape[-1])).clamp(lo, prec.qmax)


def window_sums(q: torch.Tensor, rows: list[tuple[int, int, int]],
                cols: list[tuple[int, int, int]]) -> torch.Tensor:
    """Exact int64 sums of q [N, H, W, C] over the windows rows x cols ((start, end, _) per
    axis) -> [N, len(rows), len(cols), C], from the zero-padded integral image."""
    s = F.pad(q.to(torch.int64).cumsum(1).cumsum(2), (0, 0, 1, 0, 1, 0))
    h0, h1 = (torch.tensor([r[i] for r in rows], device=q.device) for i in (0, 1))
    w0, w1 = (torch.tensor([c[i] for c in cols], device=q.device) for i in (0, 1))

    def at(hs: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
        return s[:, hs][:, :, ws]

    return at(h1, w1) - at(h0, w1) - at(h1, w0) + at(h0, w0)


class ReferenceExecutor:
    """Runs one plan (its params moved once to `device`)."""

    def __init__(self, plan: Plan, device: torch.device | str = "cpu") -> None:
        self.plan = plan
        self.device = torch.device(device)
        self.params = {k: v.to(self.device) for k, v in plan.params.items()}
        # FloatFallback modules where the steps run (a copy off the CPU)
        self.modules = {k: m if self.device.type == "cpu" else copy.deepcopy(m).to(self.device)
                        for k, m in plan.modules.items()}
        self.last_use: dict[str, int] = {}
        for i, step in enumerate(plan.steps):
            for t in step.inputs:
                self.last_use[t] = i

    def __call__(self, x: torch.Tensor, record: bool = False
                 ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Float result of the plan on x (float NCHW, on self.device); with `record`, also
        {tensor name: storage} of every tensor written (module docstring)."""
        env: dict[str, torch.Tensor] = {self.plan.input: x}
        recorded: dict[str, torch.Tensor] = {}
        result = None
        with torch.no_grad():
            for i, step in enumerate(self.plan.steps):
                if isinstance(step, Output):
                    result = self._output(step, env)
                    continue
                outs = self._run(step, env)
                for name, value in outs.items():
                    env[name] = value
                    if record:
                        recorded[name] = self.storage(name, value)
                for t in step.inputs:
                    if self.last_use[t] <= i and t != self.plan.input:
                        env.pop(t, None)
        return (result, recorded) if record else result

    def storage(self, name: str, value: torch.Tensor) -> torch.Tensor:
        spec = self.plan.tensors[name]
        if spec.is_float:
            return value.clone()
        if spec.is_wide:
            return value.to(spec.precision.storage_dtype)
        return pack(value, spec.precision, spec.layout)

    # ------------------------------------------------------------------ steps
    def _spec(self, name: str) -> TensorSpec:
        return self.plan.tensors[name]

    def _run(self, step: object, env: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if isinstance(step, Quantize) and step.table is not None:  # a uint8 image
            return {step.output: _nhwc(quantize_uint8_image(env[step.input],
                                                            self.params[step.table]))}
        if isinstance(step, Quantize):
            x = env[step.input]
            x = _nhwc(x.clamp_min(0) if step.relu else x)
            spec = self._spec(step.output)
            if spec.is_wide:  # quantize_float's formula at 16 bits
                q = round_half_up(x.float() / torch.tensor(spec.scale, dtype=torch.float32))
                return {step.output: q.clamp(spec.precision.qmin, spec.precision.qmax
                                             ).to(torch.int64)}
            return {step.output: quantize_float(x, spec.scale, spec.precision)}
        if isinstance(step, Layer):
            return self._layer(step, env)
        if isinstance(step, MaxPool):
            x, w = env[step.input], step.window
            if self._spec(step.input).is_float:
                return {step.output: F.max_pool2d(x, w.kernel, w.stride, w.pad)}
            return {step.output: maxpool2d_int(x, w.kernel, w.stride, w.pad, w.ceil)}
        if isinstance(step, AvgPool):
            return {step.output: self._avgpool(step, env[step.input])}
        if isinstance(step, Flatten):
            return {step.output: env[step.input].reshape(env[step.input].shape[0], -1)}
        if isinstance(step, Concat):
            dim = 1 if self._spec(step.output).is_float else -1
            return {step.output: torch.cat([env[p] for p in step.parts], dim=dim)}
        if isinstance(step, ChannelAffine):
            p = self.params
            return {step.output: channel_affine_int(
                [env[t] for t in step.parts], p[step.multiplier], p[step.bias], p[step.shift],
                self._spec(step.output).precision, step.relu)}
        if isinstance(step, Lookup):
            spec_in = self._spec(step.input)
            table = self.params[step.table]
            return {step.output: table[env[step.input] - spec_in.precision.qmin]}
        if isinstance(step, Gather):
            dim = 1 if self._spec(step.output).is_float else -1
            return {step.output: env[step.input].index_select(dim, self.params[step.index])}
        if isinstance(step, TableMul):
            return {step.output: table_mul_int(
                env[step.a], env[step.b], self.params[step.table],
                self._spec(step.a).precision, self._spec(step.b).precision)}
        if isinstance(step, FloatFallback):
            out = self.modules[step.module](*(self._float(a, env) for a in step.args))
            if not isinstance(out, torch.Tensor) or not out.dtype.is_floating_point:
                raise TypeError(f"{step.name}: the fallback module returned "
                                f"{type(out).__name__}, not a float tensor")
            return {step.output: out.float()}
        raise TypeError(f"unknown step {type(step).__name__}")

    def _layer(self, step: Layer, env: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        p = self.params
        acc = accumulate(step.workload, env[step.input], p[step.weight])
        res = env[step.residual] if step.residual else None
        req = [o for o in step.layer_outputs if o.requantized]
        outs: dict[str, torch.Tensor] = {}
        if req:
            values = self._requantized(step, acc, res, req)
            outs.update({o.tensor: v for o, v in zip(req, values, strict=True)})
        for o in step.layer_outputs:
            if o.requantized:
                continue
            if res is None:
                (y,) = epilogue_outputs(acc, None, [FloatOutput(p[o.scale], p[o.offset])])
            else:  # the residual term in float64 too
                y = (acc.double() * p[o.scale] + p[o.offset] + res.double() * o.residual_scale
                     ).float()
            outs[o.tensor] = _nchw(y.clamp_min(0) if o.relu else y)
        if step.pool is not None:
            w = step.pool
            for name, v in outs.items():
                outs[name] = F.max_pool2d(v, w.kernel, w.stride, w.pad, ceil_mode=w.ceil) \
                    if self._spec(name).is_float else maxpool2d_int(v, w.kernel, w.stride,
                                                                    w.pad, w.ceil)
        return outs

    def _requantized(self, step: Layer, acc: torch.Tensor, res: torch.Tensor | None,
                     outs: list[LayerOutput]) -> list[torch.Tensor]:
        """The requantized outputs, clamp(floor((acc m + b + res r + 2^(s-1)) / 2^s)):
        netops.epilogue_outputs where the layer's bias is in accumulator units (b = bias m),
        every tensor fits its 8-bit bounds and every multiplier 32 bits, else the same sum
        through netops' round_shift_sum (exact for int64 terms)."""
        p = self.params
        precs = [parse_precision(o.mid) if o.derived else self._spec(o.tensor).precision
                 for o in outs]
        wide = (res is not None and self._spec(step.residual).is_wide) or \
            any(isinstance(x, WidePrecision) for x in precs) or any(o.derived for o in outs)
        small = all(int(p[k].abs().max()) < MULT_LIMIT for o in outs
                    for k in (o.multiplier, o.residual_multiplier) if k and p[k].numel())
        if step.bias is not None and not wide and small:
            specs = [RequantizedOutput(prec, p[o.multiplier], p[o.shift],
                                       p[o.residual_multiplier] if o.residual_multiplier
                                       else None, o.relu) for o, prec in zip(outs, precs,
                                                                             strict=True)]
            return epilogue_outputs(acc, p[step.bias], specs, residual=res)
        if acc.numel() and int(acc.abs().max()) >= Y_LIMIT:
            raise ValueError(f"{step.name}: the accumulator leaves the epilogue's range +-2^32")
        if res is not None and res.numel() and int(res.abs().max()) > 2**23:
            raise ValueError(f"{step.name}: residual leaves the 24-bit range")
        results = []
        for o, prec in zip(outs, precs, strict=True):
            m, b, s = p[o.multiplier], p[o.bias], p[o.shift]
            r = p[o.residual_multiplier] if o.residual_multiplier else None
            lo = max(prec.qmin, 0) if o.relu else prec.qmin
            if self._direct(step, o, acc, res):  # |z| + 2^(s-1) < 2^63: int64 as it is
                z = acc * m + b if r is None else acc * m + b + res * r
                q = (z + (torch.ones_like(s) << (s - 1))) >> s
            else:  # the terms' sum could leave int64
                terms = [acc * m, b.expand_as(acc)] + ([] if r is None else [res * r])
                q = round_shift_sum(terms, s)
            q = q.clamp(lo, prec.qmax)
            results.append(p[o.table][q - prec.qmin] if o.derived else q)
        return results

    def _direct(self, step: Layer, o: LayerOutput, acc: torch.Tensor,
                res: torch.Tensor | None) -> bool:
        """Whether z = acc m + b + res r plus the rounding term stays below 2^63 for this
        step's accumulators and residual (bounds in exact Python integers, per channel)."""
        p = self.params
        top_acc = int(acc.abs().max()) if acc.numel() else 0
        top_res = int(res.abs().max()) if res is not None and res.numel() else 0
        m, b, s = (p[k].tolist() for k in (o.multiplier, o.bias, o.shift))
        r = p[o.residual_multiplier].tolist() if o.residual_multiplier else [0] * len(m)
        return all(top_acc * mi + abs(bi) + top_res * abs(ri) + (1 << (si - 1)) < 2**63
                   for mi, bi, ri, si in zip(m, b, r, s, strict=True))

    def _avgpool(self, step: AvgPool, x: torch.Tensor) -> torch.Tensor:
        spec = self._spec(step.output)
        if spec.is_float:
            if step.mode == WINDOW:
                y = F.avg_pool2d(x, step.kernel, step.stride, step.pad)
            elif step.mode == GLOBAL:
                y = x.mean(dim=(2, 3), keepdim=True)
            else:
                y = F.adaptive_avg_pool2d(x, step.output_hw)
            return y.clamp_min(0) if step.relu else y
        m, s = self.params[step.multiplier], self.params[step.shift]
        if step.mode in (WINDOW, GLOBAL) and not step.relu and len(step.counts) == 1 and \
                not spec.is_wide:
            return avgpool2d_int(x, step.kernel if step.mode == WINDOW else None, step.stride,
                                 step.pad, m[0], s[0], spec.precision)
        _, h, w, _ = x.shape
        oh, ow = step.output_hw or (None, None)
        rows = axis_windows(h, step.mode, step.kernel, step.stride, step.pad, oh)
        cols = axis_windows(w, step.mode, step.kernel, step.stride, step.pad, ow)
        sums = window_sums(x, rows, cols)
        count = torch.tensor([r[2] for r in rows], device=x.device).view(-1, 1) * \
            torch.tensor([c[2] for c in cols], device=x.device).view(1, -1)
        out = torch.empty_like(sums)
        for i, c in enumerate(step.counts):
            sel = count == c
            out[:, sel] = _requantize(sums[:, sel], m[i], s[i], spec.precision, step.relu)
        return out

    def _float(self, name: str, env: dict[str, torch.Tensor]) -> torch.Tensor:
        """Tensor `name` as float32 in the model's order: quantized ones dequantized
        (scale * q in float64, rounded to float32, NCHW)."""
        spec, v = self._spec(name), env[name]
        if spec.is_float:
            return v
        return _nchw(v.to(torch.float64) * spec.scale).float()

    def _output(self, step: Output, env: dict[str, torch.Tensor]) -> torch.Tensor:
        return self._float(step.input, env)


def run_plan(plan: Plan, x: torch.Tensor, record: bool = False
             ) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Run `plan` on x (float NCHW) through the reference on x's device (module docstring)."""
    return ReferenceExecutor(plan, x.device)(x, record)
