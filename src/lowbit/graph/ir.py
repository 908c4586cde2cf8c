"""The plan: a whole network as named tensors and a straight-line list of fused steps.

Tensors (`TensorSpec`) are either float32 (the input image, the logits, values around a
FloatFallback step; shape in the model's own order, NCHW for maps) or quantized: logical NHWC
integer values ([N, H, W, C], or [N, C] for vectors) with one Precision and one per-tensor
scale (real value = scale * q), stored in a Layout (INT8: one value per byte; BITPLANE:
[bits, N, H, W, ceil(C/32)] int32 words). A float value of the source model that several
consumers read appears once per distinct consumer requirement (a "realization").

Steps read and write tensors by name; their numeric vectors (weights, bias, multipliers,
shifts, float scales) live in `Plan.params` under the keys the steps name, PyTorch modules of
FloatFallback steps in `Plan.modules`. Step kinds and their exact semantics (the executor in
`lowbit.runtime.engine` runs them with `lowbit.reference.netops`):

- Quantize:  float -> quantized, quantize_float(relu?(x), scale, precision) (NCHW -> NHWC);
             a uint8 image by lookup, table[c, v] (`Plan.image_normalization`).
- Layer:     conv2d / linear on a quantized input: acc = exact integer conv / GEMM of the
             input values and the int8 weight values (KRSC / [K, C]); then per output the
             layer epilogue: requantized
             clamp(floor((acc m + b + res r + 2^(s-1)) / 2^s), lo, qmax) (lo = max(qmin, 0)
             with relu; b: the output's bias at its shift; res r: the optional residual
             operand), which with b = bias m is netops.epilogue_outputs' formula, or
             float32(scale * acc + offset + residual_scale * res) (relu: max(., 0)); then,
             with `pool`, a max-pool of every output.
- MaxPool:   max over each window's valid elements (netops.maxpool2d_int; floats: PyTorch).
- AvgPool:   window sums (zero padding counted) requantized per window count:
             clamp(floor((sum m[c] + 2^(s[c]-1)) / 2^s[c]), lo, qmax), c = the window's count;
             floats: PyTorch's average pool.
- Lookup:    quantized -> quantized, out = table[q - qmin of the input's precision].
- Gather:    channels selected by index: out[..., c] = in[..., index[c]] (floats: dim 1).
- TableMul:  the product of two quantized tensors as a table of their values:
             out = table[(a - qmin_a) * n_b + (b - qmin_b)], n_b = qmax_b - qmin_b + 1, with a
             either of b's shape or [N, 1, 1, C] (NHWC; broadcast over b's map).
- Flatten:   [N, H, W, C] -> [N, H*W*C] in (h, w, c) order (a view); floats: torch.flatten.
- Concat:    channel concatenation of tensors of one precision, scale and layout.
- ChannelAffine: a per-channel affine requantization (an eval BatchNorm no layer absorbs)
             of the channel concatenation of quantized `parts`, each at its own scale:
             clamp(floor((x[..., c] m[c] + b[c] + 2^(s[c]-1)) / 2^s[c]), lo, qmax).
- FloatFallback: a PyTorch module run in float (the plan says why) on its inputs, quantized
             ones dequantized first (scale * q, float32, NCHW).
- Output:    the float result (a quantized input is dequantized: scale * q, back to NCHW).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch
from torch import nn

from ..core import Config, Layout, Workload, workload_from_dict
from ..core import WidePrecision as WidePrecision  # the plan's names (`tensors`), re-exported
from .tensors import WIDE_BITS as WIDE_BITS
from .tensors import TensorSpec
from .tensors import parse_precision as parse_precision


@dataclass(frozen=True)
class PoolWindow:
    """A square max-pool window (PyTorch's output size; `ceil`: ceil_mode)."""

    kernel: int
    stride: int
    pad: int = 0
    ceil: bool = False

    def to_dict(self) -> dict:
        d = {"kernel": self.kernel, "stride": self.stride, "pad": self.pad}
        return {**d, "ceil": True} if self.ceil else d


@dataclass(frozen=True)
class LayerOutput:
    """One output of a Layer step: a requantized realization (multiplier, shift, bias in
    units of 2^-shift output steps, and residual_multiplier with a residual; keys into
    Plan.params, int64 [K]; with `mid` and `table` a derived output: the requantized value in
    the precision `mid`, looked up in `table`) or a float one (scale / offset float64 [K],
    residual_scale for the residual term). Multipliers are < 2^31 except on layers with a
    wide residual, whose shared shift gives both multipliers >= 31 significant bits where
    |z| < 2^61 allows (`lowbit.graph.requant.shared_shift`): their epilogue needs int64
    multipliers; a quantized residual stream's block ends keep the whole sum in 32 bits."""

    tensor: str
    relu: bool = False
    multiplier: str | None = None
    shift: str | None = None
    bias: str | None = None
    residual_multiplier: str | None = None
    scale: str | None = None
    offset: str | None = None
    residual_scale: float | None = None
    mid: str | None = None
    table: str | None = None

    @property
    def derived(self) -> bool:
        """A derived output: the formula's value in `mid` (a precision name), then `table`
        (int64 [mid.qmax - mid.qmin + 1], a Plan.params key) maps it to this output's value."""
        return self.table is not None

    @property
    def requantized(self) -> bool:
        return self.multiplier is not None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# ------------------------------------------------------------------------------ steps
@dataclass(frozen=True)
class Step:
    """Base of every step: a unique name; `inputs` / `outputs` list tensor names."""

    name: str
    kind: ClassVar[str] = "step"

    @property
    def inputs(self) -> tuple[str, ...]:
        return ()

    @property
    def outputs(self) -> tuple[str, ...]:
        return ()

    def to_dict(self) -> dict:
        d: dict = {"kind": self.kind}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, (Workload, PoolWindow, LayerOutput)):
                v = v.to_dict()
            elif isinstance(v, Config):
                v = dict(v)
            elif isinstance(v, tuple):
                v = [x.to_dict() if isinstance(x, LayerOutput) else x for x in v]
            d[f.name] = v
        return d


@dataclass(frozen=True)
class UnaryStep(Step):
    """A step reading one tensor and writing one."""

    input: str = ""
    output: str = ""

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,)

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.output,)


@dataclass(frozen=True)
class Quantize(UnaryStep):
    """`relu`: clamp at 0 first. `table`: the plan's image is uint8 (`Plan.image_normalization`)
    and its values quantize by lookup, q = table[c, v] (int64 [C, 256], a Plan.params key)."""

    relu: bool = False
    table: str | None = None
    kind: ClassVar[str] = "quantize"


@dataclass(frozen=True)
class Layer(Step):
    """A conv2d / linear layer with its fused epilogue (module docstring).

    op: 'conv2d' or 'linear'. workload: the kernel's workload (shapes, precisions, operand
    layouts and the kernel's own epilogue: the fused requantized output where the layer has
    exactly one requantized output and no pool and the implementation takes it, with the
    bias in accumulator units (`bias`) where that is exact, else at the output's shift
    (`Epilogue.shifted_bias`, the output's own `bias`), and a wide residual with its int64
    multiplier (`Epilogue.residual`) where the kernel's 64-bit sum provably fits; otherwise
    int32 acc finished by a separate epilogue pass). weight: int8 values (KRSC / [K, C],
    columns of a linear after a flatten in (h, w, c) order, segment by segment after a
    concatenation of flattens). bias: int64 [K] in accumulator units, None where every
    output is float or some output's bias is no multiple of its multiplier. impl /
    impl_reason: the implementation the layer runs on and why. config: the kernel's config
    (None for torch.fp16); config_source: where it comes from ('tuned': the records' best
    measurement of this very workload on a GPU; 'predicted': the performance model's pick;
    'default': the template's own) and config_reason the chooser's words
    (`lowbit.graph.chooser`). Launch decisions: stem (the kernel reads the float image of the
    Quantize step writing its input and quantizes it itself: the fused first layer; its
    kernel and knobs stem_config, why stem_reason: `graph.stem_choice`),
    outputs_in_kernel (the conv kernel writes every layer output from its accumulator tiles:
    no accumulator tensor, no separate epilogue pass), chained (launched as a programmatic
    dependent of the previous kernel). fused: what the step absorbs ('bn', 'relu',
    'residual', 'maxpool', 'flatten-permute', 'negated-channels'). source: the model's
    module names.
    """

    op: str = "conv2d"
    workload: Workload | None = None
    input: str = ""
    weight: str = ""
    bias: str | None = None
    residual: str | None = None
    layer_outputs: tuple[LayerOutput, ...] = ()
    pool: PoolWindow | None = None
    impl: str = ""
    impl_reason: str = ""
    fused: tuple[str, ...] = ()
    source: tuple[str, ...] = ()
    config: Config | None = None
    config_source: str = ""
    config_reason: str = ""
    stem: bool = False
    stem_config: Config | None = None
    stem_reason: str = ""
    outputs_in_kernel: bool = False
    chained: bool = False
    kind: ClassVar[str] = "layer"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,) + ((self.residual,) if self.residual else ())

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(o.tensor for o in self.layer_outputs)


@dataclass(frozen=True)
class MaxPool(UnaryStep):
    window: PoolWindow = field(default_factory=lambda: PoolWindow(2, 2))
    kind: ClassVar[str] = "maxpool"


@dataclass(frozen=True)
class AvgPool(UnaryStep):
    """Average pool. mode 'window' (kernel / stride / pad, count_include_pad), 'global' (the
    whole map) or 'adaptive' (PyTorch's adaptive windows to output_hw). counts: the distinct
    window counts in increasing order; multiplier / shift: int64 [len(counts)] param keys
    (quantized output), None for a float output. relu: clamp at 0 (a ReLU after the pool)."""

    mode: str = "global"
    kernel: int | None = None
    stride: int | None = None
    pad: int = 0
    output_hw: tuple[int, int] | None = None
    counts: tuple[int, ...] = ()
    multiplier: str | None = None
    shift: str | None = None
    relu: bool = False
    kind: ClassVar[str] = "avgpool"


@dataclass(frozen=True)
class Lookup(UnaryStep):
    """A quantized tensor mapped value by value through `table` (int64, a Plan.params key, one
    entry per value of the input's precision from its qmin): another quantizer's reading of a
    quantized value (`lowbit.quant.residual`) where no layer epilogue can write it."""

    table: str = ""
    kind: ClassVar[str] = "lookup"


@dataclass(frozen=True)
class Gather(UnaryStep):
    """Channels of the input selected by `index` (int64 [C_out], a Plan.params key): a chunk,
    a split or a channel shuffle (module docstring)."""

    index: str = ""
    kind: ClassVar[str] = "gather"


@dataclass(frozen=True)
class TableMul(Step):
    """The product of quantized tensors `a` (b's shape, or [N, 1, 1, C]: a channel scale)
    and `b` by `table` (int64 [n_a * n_b], a Plan.params key; module docstring): every
    product of their values, as the consumer reads it."""

    a: str = ""
    b: str = ""
    output: str = ""
    table: str = ""
    kind: ClassVar[str] = "table_mul"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.a, self.b)

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.output,)


@dataclass(frozen=True)
class Flatten(UnaryStep):
    kind: ClassVar[str] = "flatten"


@dataclass(frozen=True)
class PartsStep(Step):
    """A step reading several tensors (`parts`) and writing one."""

    parts: tuple[str, ...] = ()
    output: str = ""

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.parts

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.output,)


@dataclass(frozen=True)
class Concat(PartsStep):
    kind: ClassVar[str] = "concat"


@dataclass(frozen=True)
class ChannelAffine(PartsStep):
    """y = a[c] x + b[c] (an eval BatchNorm) of the channel concatenation of `parts`
    (quantized, layout INT8, each at its own scale), requantized per channel as the layer
    epilogue is: out[..., c] = clamp(floor((x[..., c] m[c] + b[c] + 2^(s[c]-1)) / 2^s[c]),
    lo, qmax), lo = max(qmin, 0) with relu; multiplier / bias / shift: int64 [C] param keys
    (m may be negative: a BatchNorm's negative scale)."""

    multiplier: str = ""
    bias: str = ""
    shift: str = ""
    relu: bool = False
    kind: ClassVar[str] = "channel_affine"


@dataclass(frozen=True)
class FloatFallback(Step):
    """`module` (a key of Plan.modules) run in float on `args` (float tensors, model order);
    op: what it computes; reason: why it is not an integer step."""

    args: tuple[str, ...] = ()
    output: str = ""
    module: str = ""
    op: str = ""
    reason: str = ""
    kind: ClassVar[str] = "float_fallback"

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.args

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.output,)


@dataclass(frozen=True)
class Output(Step):
    input: str = ""
    kind: ClassVar[str] = "output"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,)


STEP_TYPES: dict[str, type[Step]] = {c.kind: c for c in (Quantize, Layer, MaxPool, AvgPool,
                                                          Lookup, Gather, TableMul, Flatten,
                                                          Concat, ChannelAffine, FloatFallback,
                                                          Output)}


def step_from_dict(d: dict) -> Step:
    d = dict(d)
    kind = d.pop("kind", None)
    if kind not in STEP_TYPES:
        raise ValueError(f"step kind must be one of {sorted(STEP_TYPES)}, got {kind!r}")
    cls = STEP_TYPES[kind]
    if "workload" in d and d["workload"] is not None:
        d["workload"] = workload_from_dict(d["workload"])
    for key in ("window", "pool"):
        if d.get(key) is not None:
            d[key] = PoolWindow(**d[key])
    for key in ("config", "stem_config"):
        if d.get(key) is not None:
            d[key] = Config(d[key])
    if "layer_outputs" in d:
        d["layer_outputs"] = tuple(LayerOutput(**o) for o in d["layer_outputs"])
    for key in ("fused", "source", "args", "parts", "counts"):
        if key in d:
            d[key] = tuple(d[key])
    if d.get("output_hw") is not None:
        d["output_hw"] = tuple(d["output_hw"])
    return cls(**d)


# ------------------------------------------------------------------------------ plan
PLAN_FORMAT = 1


@dataclass(frozen=True, eq=False)
class Plan:
    """A compiled network for one input shape: tensors, steps in execution order, the numeric
    parameters the steps name and the modules of FloatFallback steps. `input` names the float
    NCHW image tensor, the Output step names the result."""

    input: str
    tensors: dict[str, TensorSpec]
    steps: tuple[Step, ...]
    params: dict[str, torch.Tensor]
    modules: dict[str, nn.Module]
    #: (mean, std) per channel where the plan's image is uint8 pixel values (normalized as
    #: ((v / 255) - mean) / std in the model: torchvision's ToTensor + Normalize), else None
    image_normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    def __post_init__(self) -> None:
        self.check()

    @property
    def input_dtype(self) -> torch.dtype:
        """What the plan's image holds: uint8 pixel values, or float32."""
        return torch.float32 if self.image_normalization is None else torch.uint8

    @property
    def input_spec(self) -> TensorSpec:
        return self.tensors[self.input]

    def steps_of(self, kind: type[Step]) -> list[Step]:
        return [s for s in self.steps if isinstance(s, kind)]

    @property
    def layers(self) -> list[Layer]:
        return self.steps_of(Layer)

    @property
    def fallbacks(self) -> list[FloatFallback]:
        return self.steps_of(FloatFallback)

    def check(self) -> None:
        """Every step reads tensors written before it (or the input), each tensor is written
        once, every named param and module exists; ValueError otherwise."""
        written = {self.input}
        if self.input not in self.tensors or not self.tensors[self.input].is_float:
            raise ValueError(f"plan input {self.input!r} must be a float tensor of the plan")
        for step in self.steps:
            for t in step.inputs:
                if t not in written:
                    raise ValueError(f"step {step.name} reads {t!r} before it is written")
            for t in step.outputs:
                if t in written or t not in self.tensors:
                    raise ValueError(f"step {step.name} writes {t!r} twice or undeclared")
                written.add(t)
            for key in param_keys(step):
                if key not in self.params:
                    raise ValueError(f"step {step.name} names missing param {key!r}")
            if isinstance(step, FloatFallback) and step.module not in self.modules:
                raise ValueError(f"step {step.name} names missing module {step.module!r}")
        if not self.steps or not isinstance(self.steps[-1], Output):
            raise ValueError("a plan ends with its Output step")

    # -------------------------------------------------------------- serialization
    def to_dict(self) -> dict:
        """JSON-serializable manifest; `params` (tensors) and `modules` travel separately."""
        return {"format": PLAN_FORMAT, "input": self.input,
                "image_normalization": None if self.image_normalization is None
                else [list(v) for v in self.image_normalization],
                "tensors": [t.to_dict() for t in self.tensors.values()],
                "steps": [s.to_dict() for s in self.steps],
                "params": {k: {"dtype": str(v.dtype).removeprefix("torch."),
                               "shape": list(v.shape)} for k, v in self.params.items()},
                "modules": sorted(self.modules)}

    @classmethod
    def from_dict(cls, d: dict, params: dict[str, torch.Tensor],
                  modules: dict[str, nn.Module] | None = None) -> Plan:
        """Inverse of `to_dict` given the params (and FloatFallback modules) it names."""
        if d.get("format") != PLAN_FORMAT:
            raise ValueError(f"plan format must be {PLAN_FORMAT}, got {d.get('format')!r}")
        for key, meta in d.get("params", {}).items():
            t = params.get(key)
            if t is None or list(t.shape) != meta["shape"] or \
                    str(t.dtype).removeprefix("torch.") != meta["dtype"]:
                raise ValueError(f"params[{key!r}] must be {meta['dtype']} {meta['shape']}")
        tensors = {t["name"]: TensorSpec.from_dict(t) for t in d["tensors"]}
        norm = d.get("image_normalization")
        return cls(d["input"], tensors, tuple(step_from_dict(s) for s in d["steps"]),
                   dict(params), dict(modules or {}),
                   None if norm is None else tuple(tuple(float(x) for x in v) for v in norm))

    # -------------------------------------------------------------- reports
    def weight_bytes(self) -> int:
        """Bytes of the integer weights as the chosen implementations store them."""
        return sum(layer_weight_bytes(s, self.params[s.weight]) for s in self.layers)

    def config_sources(self) -> dict[str, int]:
        """How many Layer steps take their config from each source ('tuned', 'predicted',
        'default'; '-' where the plan chose none)."""
        counts: dict[str, int] = {}
        for s in self.layers:
            counts[s.config_source or "-"] = counts.get(s.config_source or "-", 0) + 1
        return counts

    def peak_activation_bytes(self) -> int:
        """Largest sum of live tensor bytes at any step (a tensor lives from the step writing
        it to the last step reading it; the input image counts until its last reader)."""
        last = {}
        for i, step in enumerate(self.steps):
            for t in step.inputs:
                last[t] = i
        live = {self.input: self.input_spec.nbytes}
        peak = live[self.input]
        for i, step in enumerate(self.steps):
            for t in step.outputs:
                live[t] = self.tensors[t].nbytes
            peak = max(peak, sum(live.values()))
            for t in [t for t in live if last.get(t, -1) <= i]:
                del live[t]
        return peak


def param_keys(step: Step) -> list[str]:
    """Keys of Plan.params a step names."""
    keys = []
    if isinstance(step, Layer):
        keys += [step.weight] + ([step.bias] if step.bias else [])
        for o in step.layer_outputs:
            keys += [k for k in (o.multiplier, o.shift, o.bias, o.residual_multiplier,
                                 o.scale, o.offset, o.table) if k]
    elif isinstance(step, AvgPool):
        keys += [k for k in (step.multiplier, step.shift) if k]
    elif isinstance(step, ChannelAffine):
        keys += [step.multiplier, step.bias, step.shift]
    elif isinstance(step, (Lookup, TableMul)):
        keys.append(step.table)
    elif isinstance(step, Quantize) and step.table:
        keys.append(step.table)
    elif isinstance(step, Gather):
        keys.append(step.index)
    return keys


def layer_weight_bytes(step: Layer, weight: torch.Tensor) -> int:
    """Weight bytes in the layout the layer's workload names (bit planes: bits x K x words)."""
    wl = step.workload
    k = weight.shape[0]
    taps = math.prod(weight.shape[1:-1])
    c = weight.shape[-1]
    if wl.w_layout is Layout.BITPLANE:
        return wl.w.bits * k * taps * -(-c // 32) * 4
    return k * taps * c
