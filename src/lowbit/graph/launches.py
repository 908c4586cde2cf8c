"""How each Layer step is launched: the plan's last pass (pure: steps in, steps out).

- `stem`: the first layer reads the float image itself (the Triton stem kernel quantizes the
  image, convolves and writes the layer's outputs, a 3x3/2 max-pool fused) where
  `stem_refusal` finds nothing against it; the Quantize step stays in the plan (the
  reference executor runs it, the GPU executor only when recording or when another step
  reads its output).
- `outputs_in_kernel`: a layer whose kernel stores its bare int32 accumulator, with no pool,
  on a template whose kernel can write the layer epilogue's outputs itself
  (`layer_outputs_max`, the Triton implicit GEMM: `kernels.triton.conv_outputs`).
- `chained`: kernels of templates that declare `chainable` (the bit-serial families and
  `cuda.int8_wgmma`) launch as programmatic dependents of the previous kernel.

A stem's kernel and knobs are its `stem_config` (`graph.stem_choice.stem_config`: the shape's
default, or `PlanOptions.stem_kernel` where that kernel runs the layer).
`PlanOptions` turns each off (ablations and tests), and `requant32` turns on the planner's
approximate 32-bit requantizations (`graph.requant`; it acts when a plan is built, not in
`with_launches`).
Before the layers' epilogues are decided,
`fuse_maxpools` gives a layer whose every output is read only by a max-pool of one window the
pooled tensors to write (`Layer.pool`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..core import Encoding
from .impl import TORCH_FP16, template_flag
from .ir import Layer, LayerOutput, MaxPool, Plan, Quantize, Step, TensorSpec, parse_precision
from .kernel_epilogues import derived_thresholds
from .stem_choice import STEM_CHOICES, stem_config

#: (filter size, stride) of the first layers the fused stem serves: ResNet's 7x7/2, AlexNet's
#: 11x11/4, VGG's 3x3/1 (the generic int8 conv took 194 us on VGG-16's at batch 8 on an
#: H200, slower than cuDNN fp16's 129 us: 3 channels fill a tenth of its K tile) and the
#: 3x3/2 of MobileNet, EfficientNet and RegNet (MobileNet-V2's at batch 64 on an H100: 37 us
#: for the image's quantization pass and 106 us for the int8 conv, against an 11.8 us floor)
STEM_SHAPES = ((7, 2), (11, 4), (3, 1), (3, 2))
STEM_MAX_CHANNELS = 4


@dataclass(frozen=True)
class PlanOptions:
    """Switches of the plan's decisions (module docstring); the launches' on by default.
    requant32 (off by default): approximate requantizations in 32-bit arithmetic where the
    multipliers keep 12-16 bits (`graph.requant.MIN_MULTIPLIER_BITS`,
    `NARROW_MULTIPLIER_BITS`), where a value within ~2^-12 .. 2^-16 (relative) of a rounding
    tie can round the other way. Off: multipliers of 31 significant bits and 64-bit sums (the
    block ends in the kernels' 64-bit epilogue, `Epilogue.sum64`; 32 bits only where the
    same formula fits, `graph.requant.reduced`), so the plan equals `lowbit.convert` at every
    precision. guarded_block_ends: such block ends as the guarded 32-bit sum with a 64-bit
    redo near rounding steps where its band is narrow (`Epilogue.guarded`,
    `kernel_epilogues.GUARD_MAX_BAND`; exact either way; False: the plain 64-bit sum).
    stem_kernel: the fused stem's kernel (`graph.stem_choice`; None: the plan's choice)."""

    fuse_stem: bool = True
    fuse_outputs: bool = True
    chain: bool = True
    requant32: bool = False
    guarded_block_ends: bool = True
    stem_kernel: str | None = None

    def __post_init__(self) -> None:
        for name in ("fuse_stem", "fuse_outputs", "chain", "requant32", "guarded_block_ends"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"PlanOptions.{name} must be a bool, got "
                                f"{getattr(self, name)!r}")
        if self.stem_kernel is not None and self.stem_kernel not in STEM_CHOICES:
            raise ValueError(f"PlanOptions.stem_kernel must be one of {STEM_CHOICES} or None, "
                             f"got {self.stem_kernel!r}")

    def to_dict(self) -> dict:
        return {"fuse_stem": self.fuse_stem, "fuse_outputs": self.fuse_outputs,
                "chain": self.chain, "requant32": self.requant32,
                "guarded_block_ends": self.guarded_block_ends, "stem_kernel": self.stem_kernel}


def stem_refusal(plan_input: str, tensors: dict[str, TensorSpec],
                 params: dict[str, torch.Tensor], quantize: Quantize, layer: Layer
                 ) -> str | None:
    """Why the fused stem cannot run `quantize` + `layer` (None: it can)."""
    wl = layer.workload
    spec = tensors[quantize.output]
    if quantize.input != plan_input or quantize.relu or spec.is_wide:
        return "not the image's own quantizer"
    p = spec.precision
    if p.encoding is Encoding.BINARY or p.qmax > 127 or p.qmin < -128:
        return f"input precision {p} is not an int8 tensor-core operand"
    if layer.op != "conv2d" or (wl.R, wl.stride) not in STEM_SHAPES or wl.R != wl.S:
        return f"not a {' / '.join(f'{r}x{r}/{s}' for r, s in STEM_SHAPES)} conv"
    if wl.C > STEM_MAX_CHANNELS or layer.residual is not None or len(layer.layer_outputs) > 3:
        return "more than 4 channels, a residual or more than 3 outputs"
    if layer.pool is not None and ((layer.pool.kernel, layer.pool.stride) != (3, 2)
                                   or layer.pool.ceil):
        return "its max-pool is not 3x3/2 (floor mode)"
    if layer.pool is not None and any(o.derived and not _table_rises(o, tensors, params)
                                      for o in layer.layer_outputs):
        return "a pooled derived output whose table is not monotone (the kernel pools first)"
    for o in layer.layer_outputs:
        if not o.requantized and layer.pool is not None and bool((params[o.scale] < 0).any()):
            return "a pooled float output with a negative scale"
    return None


def _table_rises(o: LayerOutput, tensors: dict[str, TensorSpec],
                 params: dict[str, torch.Tensor]) -> bool:
    """Whether a derived output's table is non-decreasing over its formula's values (then
    max-pooling those values pools the table's: `kernel_epilogues.derived_thresholds` finds
    its steps)."""
    mid = parse_precision(o.mid)
    lo = max(mid.qmin, 0) if o.relu else mid.qmin
    return derived_thresholds(params[o.table], mid, lo, tensors[o.tensor].precision) is not None


def outputs_in_kernel(step: Layer) -> bool:
    """Whether the step's kernel can write its layer-epilogue outputs itself (module doc)."""
    epi = step.workload.epilogue
    return (step.impl != TORCH_FP16 and step.pool is None and not epi.requantizes
            and epi.out == "int32"
            and 1 <= len(step.layer_outputs) <= template_flag(step.impl, "layer_outputs_max"))


def decide_launches(steps: list[Step], plan_input: str, tensors: dict[str, TensorSpec],
                    params: dict[str, torch.Tensor], options: PlanOptions) -> list[Step]:
    """The steps with each Layer's launch decisions set (module docstring)."""
    producers = {t: s for s in steps for t in s.outputs}
    out = []
    for s in steps:
        if isinstance(s, Layer):
            q = producers.get(s.input)
            stem = (options.fuse_stem and isinstance(q, Quantize)
                    and stem_refusal(plan_input, tensors, params, q, s) is None)
            s = replace(s, stem=stem,
                        outputs_in_kernel=(not stem and options.fuse_outputs
                                           and outputs_in_kernel(s)),
                        chained=(not stem and options.chain
                                 and bool(template_flag(s.impl, "chainable"))))
            config, why = stem_config(s, tensors, params, options.stem_kernel) if stem else \
                (None, "")
            s = replace(s, stem_config=config, stem_reason=why)
        out.append(s)
    return out


def with_launches(plan: Plan, options: PlanOptions) -> Plan:
    """`plan` with its launch decisions made again under `options` (ablations, tests)."""
    steps = decide_launches(list(plan.steps), plan.input, plan.tensors, plan.params, options)
    return Plan(plan.input, plan.tensors, tuple(steps), plan.params, plan.modules)


def fuse_maxpools(steps: list[Step], tensors: dict[str, TensorSpec]) -> list[Step]:
    """A Layer whose every output is read only by a MaxPool of one window writes the pooled
    tensors itself (`Layer.pool`)."""
    readers: dict[str, list[Step]] = {}
    for s in steps:
        for t in s.inputs:
            readers.setdefault(t, []).append(s)
    drop: set[int] = set()
    out = []
    for s in steps:
        if isinstance(s, Layer) and s.pool is None and s.layer_outputs:
            pools = [readers.get(o.tensor, []) for o in s.layer_outputs]
            if all(len(p) == 1 and isinstance(p[0], MaxPool) for p in pools) and \
                    len({p[0].window for p in pools}) == 1:
                outs = tuple(replace(o, tensor=p[0].output)
                             for o, p in zip(s.layer_outputs, pools, strict=True))
                for o, p in zip(s.layer_outputs, pools, strict=True):
                    drop.add(id(p[0]))
                    del tensors[o.tensor]
                s = replace(s, layer_outputs=outs, pool=pools[0][0].window,
                            fused=(*s.fused, "maxpool"))
        out.append(s)
    return [s for s in out if id(s) not in drop]
