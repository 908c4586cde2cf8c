"""The layer outputs' epilogue specs, and the fused first layer's kernel and config.

`output_specs` turns a Layer's outputs into the netops epilogue specs every kernel's epilogue
takes (`kernels.triton.netops.Requantized` / `Dequantized`). `stem_config` is the plan's
decision for a Layer that runs as the fused stem (`graph.launches`): which stem kernel and
its knobs (`kernels.triton.stem.StemConfig`), carried as the Layer's `config`, so the
executor binds exactly what the plan says. The shape's default is
`kernels.triton.stem.default_config`, except that the shapes it gives the "bands" kernel
(ResNet's 7x7/2 + 3x3/2 max-pool) take the warp-specialized "ws" kernel where it can run the
layer's shape and outputs (`PREFERRED_OVER_BANDS`). `PlanOptions.stem_kernel` asks for a
kernel, taken where that kernel can run the layer's shape and outputs, else the default with
the reason in `config_reason`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

import torch

from ..core import Config, WidePrecision
from .tensors import TensorSpec, parse_precision

if TYPE_CHECKING:
    from ..kernels.triton.netops import Dequantized, Requantized
    from ..kernels.triton.stem_geometry import StemConfig, StemGeometry
    from .ir import Layer

#: the stem kernels `PlanOptions.stem_kernel` may ask for ("gemm" is only a shape default)
STEM_CHOICES = ("ws", "ring", "bands")
#: the kernel the "bands" kernel's shapes take where it runs the layer: faster at both ends of
#: the batch range (H100, same runs, w1a2: ResNet-18 b8 0.167 against 0.173 ms,
#: network-20261208-004037.json; ResNet-50 b256 4.296 against 4.365 ms,
#: network-20261207-224712.json)
PREFERRED_OVER_BANDS = "ws"
#: how `stem_config`'s reason for the shape's default begins (`stem_text` leaves it out)
DEFAULT_REASON = "the first-layer shape's default"


def output_specs(step: Layer, tensors: dict[str, TensorSpec], params: dict[str, torch.Tensor]
                 ) -> list[Requantized | Dequantized]:
    """The netops epilogue spec of each output of the step (`lowbit.runtime.engine`'s
    formulas): requantized ones with b = bias * m where the reference adds the layer's bias
    in accumulator units (a bias, no wide tensor), else the output's own shifted bias; float
    ones with their residual term, NCHW for maps."""
    from ..kernels.triton.netops import Dequantized, Requantized  # Triton on first use

    p = params
    specs: list[Requantized | Dequantized] = []
    precs = [tensors[o.tensor].precision for o in step.layer_outputs if o.requantized]
    wide = (step.residual is not None and tensors[step.residual].is_wide) or any(
        isinstance(x, WidePrecision) for x in precs)
    for o in step.layer_outputs:
        spec = tensors[o.tensor]
        if o.requantized:
            m = p[o.multiplier].to(torch.int64)
            b = m * p[step.bias].to(torch.int64) if step.bias is not None and not wide else \
                p[o.bias].to(torch.int64)
            r = p[o.residual_multiplier] if o.residual_multiplier else None
            derived = dict(mid=parse_precision(o.mid), table=p[o.table]) if o.derived else {}
            specs.append(Requantized(spec.precision, m, p[o.shift], b, r, o.relu, **derived))
        else:
            rs = o.residual_scale if step.residual is not None else None
            specs.append(Dequantized(p[o.scale], p[o.offset], rs, o.relu,
                                     channels_first=len(spec.shape) == 4))
    return specs


def stem_geometry(step: Layer) -> StemGeometry:
    """The stem kernels' geometry of a first layer (its workload's batch and image size)."""
    from ..kernels.triton.stem_geometry import StemGeometry

    wl = step.workload
    return StemGeometry(N=wl.N, C=wl.C, H=wl.H, W=wl.W, K=wl.K, R=wl.R, stride=wl.stride,
                        pad=wl.pad, pool_pad=step.pool.pad if step.pool is not None else None)


def as_stem_config(config: Config | None) -> StemConfig | None:
    """A Layer's `stem_config` as the kernels' StemConfig (the executor's binding; None, a plan
    saved before plans carried it: the kernels' default)."""
    from ..kernels.triton.stem_geometry import StemConfig

    return None if config is None else StemConfig(**dict(config))


def stem_text(step: Layer) -> str:
    """The fused stem's launch as the plan fixed it: kernel, knobs and why."""
    from ..kernels.triton.stem_geometry import StemConfig

    cfg = step.stem_config
    kernel = "triton" if cfg is None else ("cuda ws" if cfg["kernel"] == "ws" else
                                           f"triton {cfg['kernel']}")
    base = _as_config(StemConfig())  # the knobs at their defaults are left out
    knobs = "" if cfg is None else "; " + " ".join(
        f"{k}={v}" for k, v in cfg.items() if k != "kernel" and base.get(k) != v)
    why = "" if not step.stem_reason or step.stem_reason.startswith(DEFAULT_REASON) else \
        f"; {step.stem_reason}"
    return f"{kernel} stem (image quantized, conv, epilogue" + (
        ", 3x3/2 max-pool" if step.pool else "") + knobs + why + ")"


def _as_config(cfg: StemConfig) -> Config:
    return Config({k: v for k, v in asdict(cfg).items() if v is not None})


def stem_config(step: Layer, tensors: dict[str, TensorSpec], params: dict[str, torch.Tensor],
                kernel: str | None = None) -> tuple[Config, str]:
    """(config, reason) of a Layer the fused stem runs: `kernel` ("ws", "ring" or "bands";
    None: `PREFERRED_OVER_BANDS` on the bands kernel's shapes) where it can run the layer's
    shape and outputs, else the shape's default (module docstring)."""
    from ..kernels.cuda.stem_ws import ws_outputs_refusal, ws_refusal
    from ..kernels.triton.stem import default_config, ring_config, ring_refusal, ws_config

    geom = stem_geometry(step)
    default = default_config(geom)
    reason = f"{DEFAULT_REASON} ({default.kernel} kernel)"
    if kernel is not None and kernel not in STEM_CHOICES:
        raise ValueError(f"kernel must be one of {STEM_CHOICES} or None, got {kernel!r}")
    asked = kernel
    if kernel is None and default.kernel == "bands":
        kernel = PREFERRED_OVER_BANDS
    if kernel is None or kernel == default.kernel:
        return _as_config(default), reason
    if kernel == "bands":
        return _as_config(default), f"{reason}: the bands kernel runs pooled 7x7/2 shapes"
    if kernel == "ring":
        why = ring_refusal(geom)
    else:
        layouts = [tensors[o.tensor].layout for o in step.layer_outputs]
        why = ws_refusal(geom) or ws_outputs_refusal(
            output_specs(step, tensors, params), layouts, geom.K)
    if why is not None:
        return _as_config(default), f"{reason}: the {kernel} kernel cannot run it ({why})"
    chosen = ring_config(geom) if kernel == "ring" else ws_config(geom)
    if asked is None:
        return _as_config(chosen), (f"the {kernel} kernel (measured faster than the bands "
                                    f"kernel on this shape)")
    return _as_config(chosen), f"the {kernel} kernel (PlanOptions.stem_kernel)"
