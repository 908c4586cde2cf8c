"""The conv / GEMM kernel of each Layer step, its packed weights and its epilogue specs.

`layer_kernel(step)` builds a Layer's kernel (GPU): the step's template and config as the plan
chose them (`step.impl`, `step.config`; `lowbit.graph.chooser`), once per distinct
(template, workload, config). "torch.fp16" layers run on the exact fp16 tensor-core template
(`triton.conv2d_fp16`: integer operands are exact in fp16, the fp32 accumulator exact while
the worst-case |acc| < 2^24; a GEMM as a 1x1 conv), else as a float64 PyTorch conv / matmul
of the integer values (exact while |acc| < 2^53). Every kernel here has the template
contract `bind(x, w, params, out) -> launcher` and equals `lowbit.reference.run`.

Without a GPU, `reference_kernel(step)` stands in with the same contract (the reference run,
copied into `out`); `interpreted_kernel(step)` runs the Triton int8 / fp16 templates under
TRITON_INTERPRET=1 and the reference for the others.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache

import torch
import torch.nn.functional as F

from ..core import (
    Config,
    ConvWorkload,
    Epilogue,
    GemmWorkload,
    Workload,
)
from ..core.epilogue import EpilogueParams
from ..core.progress import progress
from ..core.validate import check_inputs, output_buffer
from ..graph.chooser import default_kernel
from ..graph.ir import Layer, Plan
from ..graph.kernel_epilogues import derived_thresholds
from ..kernels import get_template, load_backends
from ..kernels.base import TORCH_FP16, Kernel, acc_bound
from ..quant.packing import pack
from ..reference import run as reference_run

#: the registered template that runs TORCH_FP16 layers exactly (fp16 operands, fp32 sums)
FP16_CONV_TEMPLATE = "triton.conv2d_fp16"
EXACT_FP32, EXACT_FP64 = 2**24, 2**53
#: Triton templates the interpreter runs on the CPU (`interpreted_kernel`)
INTERPRETABLE = ("triton.conv2d_int8", "triton.gemm_int8", "triton.gemv_int8")

KernelFactory = Callable[[Layer], Kernel]


# ------------------------------------------------------------------------------ shims
class _Callable:
    """`kernel(x, w, params, out=None)`: bind and launch once (the Kernel protocol)."""

    def __call__(self, x, w, params, out=None):
        return self.bind(x, w, params, out)()


class ReferenceKernel(_Callable):
    """`lowbit.reference.run` behind the kernel contract (CPU stand-in of any template)."""

    def __init__(self, workload: Workload, name: str = "reference") -> None:
        self.workload = workload
        self.config = None
        self.name = name

    def bind(self, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
             out: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
        check_inputs(self.workload, x, w, params)
        out = output_buffer(self.workload, x.device, out)

        def launch() -> torch.Tensor:
            out.copy_(reference_run(self.workload, x, w, params))
            return out

        return launch


class Float64Kernel(_Callable):
    """A conv / GEMM with int32 output as a float64 PyTorch op on the integer values: exact
    while the worst-case |acc| < 2^53 (checked). For "torch.fp16" layers beyond the fp16
    template's fp32 bound."""

    def __init__(self, workload: Workload) -> None:
        if workload.epilogue != Epilogue():
            raise ValueError("Float64Kernel writes the int32 accumulator only")
        if acc_bound(workload) >= EXACT_FP64:
            raise ValueError(f"{workload.key}: |acc| may reach 2^53, float64 is not exact")
        self.workload = workload
        self.config = None
        self.name = "torch.float64"

    def bind(self, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
             out: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
        wl = self.workload
        check_inputs(wl, x, w, params)
        out = output_buffer(wl, x.device, out)
        wd = w.to(torch.float64)
        if isinstance(wl, ConvWorkload):
            wd = wd.permute(0, 3, 1, 2).contiguous()

            def launch() -> torch.Tensor:
                y = F.conv2d(x.permute(0, 3, 1, 2).to(torch.float64), wd, stride=wl.stride,
                             padding=wl.pad)
                out.copy_(y.permute(0, 2, 3, 1))
                return out
        else:
            def launch() -> torch.Tensor:
                out.copy_(x.to(torch.float64) @ wd.t())
                return out

        return launch


def gemm_as_conv(wl: GemmWorkload) -> ConvWorkload:
    """The 1x1 conv with the GEMM's storage: [M, K] = [M, 1, 1, K] NHWC, [N, K] KRSC."""
    m, n, k = wl.gemm_shape
    return ConvWorkload(N=m, H=1, W=1, C=k, K=n, R=1, S=1, stride=1, pad=0, w=wl.w, a=wl.a,
                        epilogue=wl.epilogue, a_layout=wl.a_layout, w_layout=wl.w_layout)


class ConvAsGemmKernel(_Callable):
    """A conv kernel serving a GEMM workload through `gemm_as_conv` (views, no copies)."""

    def __init__(self, workload: GemmWorkload, conv_kernel: Kernel) -> None:
        self.workload = workload
        self.conv = conv_kernel
        self.config = conv_kernel.config
        self.name = getattr(conv_kernel, "template", "conv")

    def bind(self, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
             out: torch.Tensor | None = None) -> Callable[[], torch.Tensor]:
        check_inputs(self.workload, x, w, params)
        out = output_buffer(self.workload, x.device, out)
        m, n, k = self.workload.gemm_shape
        inner = self.conv.bind(x.view(m, 1, 1, k), w.view(n, 1, 1, k), params,
                               out.view(m, 1, 1, n))

        def launch() -> torch.Tensor:
            inner()
            return out

        return launch


# ------------------------------------------------------------------------------ factories
@cache
def _built(template: str, workload: Workload, config: Config | None) -> Kernel:
    load_backends()
    t = get_template(template)
    return t.build(workload, t.default_config(workload) if config is None else config)


def fp16_kernel(workload: Workload) -> tuple[Kernel, str]:
    """The kernel of a "torch.fp16" layer and how it runs (module docstring)."""
    load_backends()
    conv = gemm_as_conv(workload) if isinstance(workload, GemmWorkload) else workload
    reason = get_template(FP16_CONV_TEMPLATE).unsupported_reason(conv)
    if reason is None:
        kernel = _built(FP16_CONV_TEMPLATE, conv, None)
        if isinstance(workload, GemmWorkload):
            kernel = ConvAsGemmKernel(workload, kernel)
        return kernel, f"{FP16_CONV_TEMPLATE} (exact: worst-case |acc| < 2^24)"
    return Float64Kernel(workload), f"torch float64 (exact: |acc| < 2^53; fp16 template: " \
                                    f"{reason})"


def layer_kernel(step: Layer) -> Kernel:
    """The GPU kernel of a Layer step (module docstring): the plan's template and config
    (`step.impl`, `step.config`: chosen at plan time, `lowbit.graph.chooser`); "torch.fp16"
    through `fp16_kernel`. Built once per (template, workload, config)."""
    if step.impl == TORCH_FP16:
        return fp16_kernel(step.workload)[0]
    if step.config is None:  # a plan saved before plans carried configs: the untuned kernel
        choice = default_kernel(step.workload, step.impl)
        return _built(choice.template, step.workload, choice.config)
    return _built(step.impl, step.workload, step.config)


def prebuild(steps: list[Layer], factory: KernelFactory = layer_kernel,
             workers: int = 8) -> int:
    """Build the kernels of `steps` (one per distinct (impl, workload, config)) in `workers`
    threads:
    NVRTC releases the GIL, so a network's bit-serial kernels compile side by side (their
    modules load lazily, on first launch). Returns how many were built."""
    distinct = {(s.impl, s.workload, s.config): s for s in steps}
    with progress("building kernels", total=len(distinct)) as bar:
        if workers <= 1 or len(distinct) <= 1:
            for s in distinct.values():
                factory(s)
                bar.advance()
            return len(distinct)
        with ThreadPoolExecutor(min(workers, len(distinct))) as pool:
            for _ in pool.map(factory, distinct.values()):
                bar.advance()
    return len(distinct)


def reference_kernel(step: Layer) -> Kernel:
    """CPU stand-in for any Layer step's kernel."""
    return ReferenceKernel(step.workload, f"reference ({step.impl})")


def interpreted_kernel(step: Layer) -> Kernel:
    """Triton int8 / fp16 templates under the interpreter, the reference for the rest."""
    if step.impl in INTERPRETABLE:
        return _built(step.impl, step.workload, step.config)
    if step.impl == TORCH_FP16:
        kernel, how = fp16_kernel(step.workload)
        if how.startswith(FP16_CONV_TEMPLATE):
            return kernel
    return reference_kernel(step)


def describe_kernel(step: Layer, kernel: Kernel) -> str:
    """How the step's conv / GEMM runs, for the executor's summary."""
    if step.impl == TORCH_FP16:
        if isinstance(kernel, Float64Kernel):
            return "torch.fp16 layer as a float64 torch op (exact: |acc| < 2^53)"
        if isinstance(kernel, ReferenceKernel):
            return f"torch.fp16 layer on {kernel.name}"
        return f"torch.fp16 layer on {FP16_CONV_TEMPLATE} (exact: |acc| < 2^24)"
    name = getattr(kernel, "name", None) or getattr(kernel, "template", step.impl)
    # some kernels hold their template object, not its name
    return name if isinstance(name, str) else str(getattr(name, "name", step.impl))


# ------------------------------------------------------------------------------ operands
def packed_weight(step: Layer, plan: Plan, device: torch.device) -> torch.Tensor:
    """The step's int8 weight values in its workload's weight layout, on `device`."""
    wl = step.workload
    return pack(plan.params[step.weight].to(torch.int64), wl.w, wl.w_layout).contiguous().to(
        device)


def block_end_params(step: Layer, plan: Plan, device: torch.device,
                     residual: torch.Tensor | None,
                     derived_out: list[torch.Tensor] | None) -> EpilogueParams:
    """The block-end epilogue's vectors (`Epilogue.requant32`, graph.kernel_epilogues): the
    one formula's int32 multiplier and shift, its bias (at the shift) and residual
    multiplier (int32; int64 with Epilogue.sum64), the
    residual buffer, and per derived output its thresholds (from the plan's table) and its
    buffer (`derived_out`, in the workload's derived order)."""
    epi = step.workload.epilogue
    p = plan.params
    first = step.layer_outputs[0]
    mid = epi.out
    lo = max(mid.qmin, 0) if epi.relu else mid.qmin

    def i32(key: str) -> torch.Tensor:
        return p[key].to(torch.int32).contiguous().to(device)

    def wide(key: str) -> torch.Tensor:  # the bias and residual multiplier
        return p[key].to(torch.int64).contiguous().to(device) if epi.sum64 else i32(key)

    derived = [o for o in step.layer_outputs if o.derived]
    thresholds = tuple(
        derived_thresholds(p[o.table], mid, lo, plan.tensors[o.tensor].precision).to(device)
        for o in derived)
    if epi.derived and derived_out is None:
        raise ValueError(f"{step.name}: its epilogue writes derived outputs, pass their buffers")
    if epi.residual is not None and residual is None:
        raise ValueError(f"{step.name}: its epilogue adds a residual, pass its buffer")
    return EpilogueParams(
        multiplier=i32(first.multiplier), shift=i32(first.shift), shifted_bias=wide(first.bias),
        residual=residual if epi.residual is not None else None,
        residual_multiplier=wide(first.residual_multiplier) if epi.residual is not None
        else None, thresholds=thresholds, derived_out=tuple(derived_out or ()))


def kernel_params(step: Layer, plan: Plan, device: torch.device,
                  residual: torch.Tensor | None = None,
                  derived_out: list[torch.Tensor] | None = None) -> EpilogueParams:
    """The run-time vectors of the workload's own epilogue: none for an int32 accumulator;
    multiplier and shift of the one output for a fused requantization, with its bias in
    accumulator units (`step.bias`, Epilogue.bias) or at its shift (the output's int64 bias,
    Epilogue.shifted_bias); with Epilogue.residual also `residual` (the step's residual
    buffer, its wide storage) and the int64 multipliers."""
    epi = step.workload.epilogue
    if not epi.requantizes:
        return EpilogueParams()
    if epi.requant32:
        return block_end_params(step, plan, device, residual, derived_out)
    (o,) = step.layer_outputs
    p = plan.params

    def i32(key: str) -> torch.Tensor:
        return p[key].to(torch.int32).contiguous().to(device)

    def i64(key: str) -> torch.Tensor:
        return p[key].to(torch.int64).contiguous().to(device)

    shifted = i64(o.bias) if epi.shifted_bias else None
    if epi.residual is None:
        return EpilogueParams(bias=i32(step.bias) if epi.bias else None,
                              multiplier=i32(o.multiplier), shift=i32(o.shift),
                              shifted_bias=shifted)
    if residual is None:
        raise ValueError(f"{step.name}: its epilogue adds a residual, pass its buffer")
    return EpilogueParams(multiplier=i64(o.multiplier), shift=i32(o.shift),
                          shifted_bias=shifted, residual=residual,
                          residual_multiplier=i64(o.residual_multiplier))
