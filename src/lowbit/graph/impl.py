"""Which implementation runs a layer: the one pluggable choice of the planner.

`choose_impl(workload) -> (impl, reason)` is the default policy (zero tuning): bit-serial b1
AND tensor cores when both operands have <= 4 bits (bit-plane operands; the impl names the
kernel family that `lowbit.kernels.cuda.default_bitserial` picks, e.g.
`cuda.bitserial_wgmma`), else the int8 tensor-core templates (one value per byte, in an order
measured per size: INT8_CONV / INT8_CONV_LARGE; a GEMM of
at most GEMV_ROWS rows, and a conv with a spatial filter on at most GEMV_CONV_PIXELS output
pixels, first on the weight-streaming `triton.gemv_int8`, which reads each weight byte once
with the grid split over K: at that size the layer is bound by the weight bytes, and the tile
templates pad the rows to 64 and fill few SMs; a 1x1 stride-1 conv of few input channels first
on the persistent `triton.conv2d_pointwise`), else PyTorch fp16 (`torch.fp16`) when
no integer template supports the workload; every refusal is
asked of the templates (`KernelTemplate.unsupported_reason`) and quoted in the reason. A
chooser with the same signature (e.g. one reading tuning records, `lowbit.tune.dispatch`)
replaces it through `lowbit.compile(..., choose_impl=...)`; `input_layout(impl)` says what its
input must be.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from ..core import ConvWorkload, Layout, Workload
from ..kernels import get_template, load_backends, templates
from ..kernels.base import TORCH_FP16

#: prefix of the bit-serial family templates' names (`lowbit.kernels.cuda.FAMILIES`)
BITSERIAL = "cuda.bitserial"
#: int8 templates in the order the default policy prefers them
INT8_CONV = ("cuda.int8_wgmma", "triton.conv2d_int8_tma", "triton.conv2d_int8")
#: the order for convs of at least LARGE_CONV_OUTPUTS output values. Measured on an H200,
#: ResNet-50 w8a8 (network-20261127-234313.json): at batch 256 (6-205 M outputs a layer) the
#: Triton implicit GEMM took 12.87 ms, `cuda.int8_wgmma` 13.88; at batch 8 (<= 1.6 M outputs
#: a layer) the Triton kernels were slower (network-20261127-235612.json: ResNet-18 0.48
#: against 0.37 ms, ResNet-50 1.14 against 0.95)
INT8_CONV_LARGE = ("triton.conv2d_int8", "cuda.int8_wgmma", "triton.conv2d_int8_tma")
LARGE_CONV_OUTPUTS = 1 << 22
#: large 1x1 expansions of few channels (at most this many in, at least 2x as many out) keep
#: INT8_CONV's order: MobileNet-V2 b64 on an H100 (network-20261207-191118.json),
#: `cuda.int8_wgmma` against the Triton implicit GEMM on 16 -> 96 at 112 x 112 171.6 against
#: 224.6 us, 24 -> 144 at 56 x 56 86 against 116, 32 -> 192 at 28 x 28 30 against 32; slower
#: on 64 -> 384 at 14 x 14 (24.5 against 19.5) and on the 32 -> 16 projection (58 against 45)
FEW_CHANNEL_EXPANSION = 32
#: 1x1 stride-1 convs of at most FEW_CHANNEL_POINTWISE input channels run first on the
#: persistent weight-resident kernel (`triton.conv2d_pointwise`): one reduction step a tile,
#: so the tile-per-program templates overlap nothing across tiles (MobileNet-V2 b64 on an H100,
#: network-20261207-191118.json: 16 -> 96 at 112 x 112 172-225 us against a 30 us DRAM floor);
#: where it refuses, the order above
POINTWISE = "triton.conv2d_pointwise"
FEW_CHANNEL_POINTWISE = 64
INT8_GEMM = ("cuda.int8_wgmma", "triton.gemm_int8")
#: the skinny-GEMM template and the most rows it is the default for
INT8_GEMV = "triton.gemv_int8"
GEMV_ROWS = 16
#: the most output pixels (N*P*Q) of a conv with a spatial filter (R*S > 1) the GEMV is the
#: default for. Measured on an H100, batch 1 (gemv-20261128-050456.json, defaults, events):
#: the 3x3s on 7x7 / 14x14 maps 9.0-11.3 us on the GEMV against 10.7-29.4 on
#: `cuda.int8_wgmma` (2.6x on 512 -> 512); the 1x1s 8.4-10.4 against 8.4-16.4, mixed: they
#: keep the conv order
GEMV_CONV_PIXELS = 64
#: the templates of depthwise (groups == C == K) and other grouped convs: one value per byte
#: (the bit-serial families and the dense int8 templates refuse groups)
DEPTHWISE = "triton.conv2d_depthwise"
GROUPED = "triton.conv2d_grouped_int8"
#: grouped convs of <= 16 channels a group on CUDA cores (dp4a): after the tensor-core
#: template until measured on a GPU (`int8_preferring` puts it first)
GROUPED_CUDA = "triton.conv2d_grouped_cuda"
#: the bit widths bit-serial serves by default (both operands)
BITSERIAL_MAX_BITS = 4

ImplChooser = Callable[[Workload], tuple[str, str]]


@cache
def _backends() -> tuple[str, ...]:
    """Registered template names (importing the built-in backends once)."""
    load_backends()
    return tuple(t.name for t in templates())


def is_bitserial(impl: str) -> bool:
    """Whether `impl` is one of the bit-serial family templates (bit-plane operands)."""
    return impl.startswith(BITSERIAL)


def input_layout(impl: str) -> Layout:
    """The activation / weight layout an implementation reads."""
    return Layout.BITPLANE if is_bitserial(impl) else Layout.INT8


def with_layout(wl: Workload, layout: Layout) -> Workload:
    return wl.replace(a_layout=layout, w_layout=layout)


def unsupported_reason(impl: str, workload: Workload) -> str | None:
    """Why `impl` cannot run `workload` (in its input layout), None when it can; torch.fp16
    runs everything; BITSERIAL asks whether any bit-serial family can."""
    if impl == TORCH_FP16:
        return None
    if impl == BITSERIAL:
        _backends()
        from ..kernels.cuda.bitserial_shape import bitplane_reason

        return bitplane_reason(with_layout(workload, Layout.BITPLANE))
    if impl not in _backends():
        return f"{impl} is not registered"
    return get_template(impl).unsupported_reason(with_layout(workload, input_layout(impl)))


def few_channel_expansion(wl: ConvWorkload) -> bool:
    """A 1x1 stride-1 conv of at most FEW_CHANNEL_EXPANSION input channels into at least twice
    as many (INT8_CONV's order at any size)."""
    return (wl.R, wl.S, wl.stride) == (1, 1, 1) and wl.C <= FEW_CHANNEL_EXPANSION and \
        wl.K >= 2 * wl.C


def few_channel_pointwise(wl: ConvWorkload) -> bool:
    """A dense 1x1 stride-1 unpadded conv of at most FEW_CHANNEL_POINTWISE input channels
    (POINTWISE first)."""
    return (wl.R, wl.S, wl.stride, wl.pad, wl.groups) == (1, 1, 1, 0, 1) and \
        wl.C <= FEW_CHANNEL_POINTWISE


def _int8_choice(wl: Workload, why_not_bitserial: str | None,
                 first: str | None = None, skip: str | None = None) -> tuple[str, str]:
    if isinstance(wl, ConvWorkload) and wl.groups > 1:
        names = (DEPTHWISE,) if wl.depthwise else (GROUPED, GROUPED_CUDA)
    elif isinstance(wl, ConvWorkload):
        m, n, _ = wl.gemm_shape
        names = INT8_CONV_LARGE if m * n >= LARGE_CONV_OUTPUTS and not \
            few_channel_expansion(wl) else INT8_CONV
        if m <= GEMV_CONV_PIXELS and wl.R * wl.S > 1:
            names = (INT8_GEMV, *names)
        if few_channel_pointwise(wl):
            names = (POINTWISE, *names)
    else:
        names = ((INT8_GEMV,) if wl.gemm_shape[0] <= GEMV_ROWS else ()) + INT8_GEMM
    if first in names:
        names = (first, *(n for n in names if n != first))
    names = tuple(n for n in names if n != skip)
    refusals = []
    for name in names:
        reason = unsupported_reason(name, wl)
        if reason is None:
            why = f"w{wl.w.bits}a{wl.a.bits} ({wl.w} x {wl.a}) on int8 tensor cores"
            if name == POINTWISE:
                why += (f" (a 1x1 of C={wl.C} <= {FEW_CHANNEL_POINTWISE} channels: the "
                        "persistent weight-resident kernel)")
            if why_not_bitserial:
                why += f" (bit-serial: {why_not_bitserial})"
            if refusals:
                why += "; " + "; ".join(refusals)
            return name, why
        refusals.append(f"{name}: {reason}")
    return TORCH_FP16, "no integer template runs it: " + "; ".join(
        ([f"{BITSERIAL}: {why_not_bitserial}"] if why_not_bitserial else []) + refusals)


def choose_impl(workload: Workload, int8_first: str | None = None,
                int8_skip: str | None = None) -> tuple[str, str]:
    """The default implementation of a layer and why (module docstring); int8_first: an int8
    template tried before the others where it applies (`int8_preferring`); int8_skip: one
    never tried (`int8_without`)."""
    wl = workload
    if isinstance(wl, ConvWorkload) and wl.groups > 1:
        return _int8_choice(wl, f"groups={wl.groups} (a grouped conv)", int8_first, int8_skip)
    if wl.w.bits <= BITSERIAL_MAX_BITS and wl.a.bits <= BITSERIAL_MAX_BITS:
        reason = unsupported_reason(BITSERIAL, wl)
        if reason is None:
            return bitserial_family(wl), (
                f"w{wl.w.bits}a{wl.a.bits}: both operands <= {BITSERIAL_MAX_BITS} bits, "
                "bit-serial on b1 AND tensor cores")
        return _int8_choice(wl, reason, int8_first, int8_skip)
    return _int8_choice(wl, None, int8_first, int8_skip)


#: the int8 templates of the policy (INT8_CONV_LARGE orders the same names)
INT8_POLICY = frozenset({*INT8_CONV, *INT8_GEMM, INT8_GEMV, GROUPED, GROUPED_CUDA, POINTWISE})


def _policy_template(template: str) -> str:
    if template not in INT8_POLICY:
        raise ValueError(f"template must be one of {sorted(INT8_POLICY)}, got {template!r}")
    return template


def int8_preferring(template: str) -> ImplChooser:
    """The default policy with the int8 template `template` tried first wherever it is one of
    the candidates (a conv template for convs, a grouped one for grouped convs, a GEMM one for
    linear layers); ValueError when it is not an int8 template of the policy."""
    _policy_template(template)

    def chooser(workload: Workload) -> tuple[str, str]:
        return choose_impl(workload, template)

    return chooser


def int8_without(template: str) -> ImplChooser:
    """The default policy with the int8 template `template` never tried (the order behind
    it: the A/B of a template the policy puts first, e.g. POINTWISE); ValueError when it is
    not an int8 template of the policy."""
    _policy_template(template)

    def chooser(workload: Workload) -> tuple[str, str]:
        return choose_impl(workload, int8_skip=template)

    return chooser


@cache
def bitserial_family(workload: Workload) -> str:
    """Name of the bit-serial family whose untuned default serves `workload` (bit planes) on
    this machine's target arch (`lowbit.kernels.cuda.default_bitserial`)."""
    _backends()
    from ..kernels.cuda import default_bitserial

    return default_bitserial(with_layout(workload, Layout.BITPLANE))[0].name


def runs(impl: str, workload: Workload) -> bool:
    """Whether `impl` runs `workload` (in its input layout) with a config it can build: no
    refusal, and a default config (a space with no valid point for this epilogue, e.g. bit-plane
    outputs narrower than a packing tile, is a refusal too)."""
    if unsupported_reason(impl, workload) is not None:
        return False
    if impl == TORCH_FP16:
        return True
    if is_bitserial(impl):  # a family of the preferred list has a config for it
        try:
            bitserial_family(workload)
        except ValueError:
            return False
        return True
    try:
        get_template(impl).default_config(with_layout(workload, input_layout(impl)))
    except (ValueError, IndexError, KeyError):
        return False
    return True


def template_flag(impl: str, flag: str) -> bool | int:
    """The registered template's class attribute `flag` (False where it has none, for
    torch.fp16 and for names no template has): what a template declares it can do
    (`takes_shifted_bias`, `takes_residual`, `layer_outputs_max`, `streams_weights`,
    `chainable`)."""
    if impl == TORCH_FP16:
        return False
    _backends()
    try:
        template = get_template(impl)
    except ValueError:
        return False
    value = getattr(template, flag, False)
    return value if isinstance(value, int) else bool(value)


def choose_int8_impl(workload: Workload, why_not_bitplanes: str) -> tuple[str, str]:
    """The default choice among layouts of one value per byte (the input cannot be bit
    planes, `why_not_bitplanes`)."""
    return _int8_choice(workload, why_not_bitplanes)
