"""Pieces shared by the ONNX Q/DQ import (`onnx_qdq.from_onnx`) and export
(`onnx_export.to_onnx`): the lazy onnx import, ONNX integer types, the precision of an integer
range, and the fixed-scale quantizers an imported model holds (lowbit's LSQ quantizers with the
file's scales as their steps, so the model fine-tunes with LSQ QAT as it is, and a standalone
fake-quant module for a Q/DQ that no conv / linear layer reads)."""

from __future__ import annotations

import numpy as np
import torch
import torch.fx
from torch import nn

from ..core import Precision
from .learned import LSQActQuantizer, LSQWeightQuantizer
from .quantize import fake_quantize

#: metadata key (`to_onnx`): JSON list of the DequantizeLinear outputs holding binary weights
BINARY_WEIGHTS_KEY = "lowbit.binary_weights"


def require_onnx():
    """The onnx module, or an ImportError saying how to install it."""
    try:
        import onnx
    except ImportError as e:
        raise ImportError("lowbit.from_onnx / lowbit.to_onnx need the onnx package: "
                          "pip install onnx") from e
    return onnx


def integer_ranges() -> dict[int, tuple[int, int]]:
    """{ONNX integer element type: (min, max)} of the types a QuantizeLinear may produce."""
    tp = require_onnx().TensorProto
    ranges = {tp.INT8: (-128, 127), tp.UINT8: (0, 255), tp.INT16: (-32768, 32767),
              tp.UINT16: (0, 65535), tp.INT32: (-(2**31), 2**31 - 1)}
    for name, rng in (("INT4", (-8, 7)), ("UINT4", (0, 15)), ("INT2", (-2, 1)),
                      ("UINT2", (0, 3))):
        if hasattr(tp, name):
            ranges[getattr(tp, name)] = rng
    return ranges


@torch.fx.wrap
def quantize_dequantize(x: torch.Tensor, scale: float, bits: int, signed: bool) -> torch.Tensor:
    """clamp(round_half_up(x / scale), qmin, qmax) * scale at `bits` (signed or unsigned),
    straight-through gradient inside the range: one fx node (a float step in a plan)."""
    prec = Precision(bits, "signed" if signed else "unsigned")
    return fake_quantize(x, torch.tensor(scale, dtype=x.dtype, device=x.device), prec)


class StandaloneQuant(nn.Module):
    """A file's activation Q/DQ read by other ops than conv / linear layers (a residual add, a
    concat, an average pool, the output): quantize-dequantize in float with the file's scale.
    fx-traceable; `lowbit.compile` runs it as a float step ("function quantize_dequantize")."""

    def __init__(self, prec: Precision, scale: float) -> None:
        super().__init__()
        self.prec, self.scale = prec, float(scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quantize_dequantize(x, self.scale, self.prec.bits, self.prec.qmin < 0)

    def extra_repr(self) -> str:
        return f"{self.prec}, scale={self.scale:.6g}"


def fixed_act_quantizer(prec: Precision, scale: float, name: str) -> LSQActQuantizer:
    """An LSQ activation quantizer holding `scale` (its step) at `prec`, ready for convert."""
    q = LSQActQuantizer(prec.bits, signed=prec.qmin < 0, layer_name=name)
    with torch.no_grad():
        q.step_size.fill_(float(scale))
        q.initialized.fill_(True)
        q.observer.seen.fill_(1)
        q.observer.top.fill_(float(scale) * prec.qmax)
    q.frozen = True
    return q


def fixed_weight_quantizer(bits: int, scale: np.ndarray, name: str) -> LSQWeightQuantizer:
    """An LSQ weight quantizer holding the per-output-channel `scale` [K] (its steps)."""
    q = LSQWeightQuantizer(bits, scale.size, layer_name=name)
    with torch.no_grad():
        q.step_size.copy_(torch.from_numpy(scale.astype(np.float32)))
        q.initialized.fill_(True)
    return q


def act_precision(lo: int, hi: int, where: str) -> Precision:
    """The activation precision of the integer range [lo, hi]: [0, 2^b - 1] unsigned b bits
    (1-8), [-2^(b-1), 2^(b-1) - 1] signed b bits (2-8); ValueError naming `where` otherwise."""
    for b in range(1, 9):
        if (lo, hi) == (0, 2**b - 1):
            return Precision(b, "unsigned")
        if b >= 2 and (lo, hi) == (-(2 ** (b - 1)), 2 ** (b - 1) - 1):
            return Precision(b, "signed")
    raise ValueError(f"{where}: activation range [{lo}, {hi}] is not the full range of a 1-8 "
                     "bit unsigned or 2-8 bit signed integer (lowbit quantizes activations "
                     "over the full range: narrow ranges are not supported)")


def weight_bits(lo: int, hi: int, where: str) -> int:
    """The smallest signed width (2-8 bits) holding the weight range [lo, hi]."""
    for b in range(2, 9):
        if -(2 ** (b - 1)) <= lo and hi <= 2 ** (b - 1) - 1:
            return b
    raise ValueError(f"{where}: weight range [{lo}, {hi}] needs more than 8 signed bits")


__all__ = [
    "BINARY_WEIGHTS_KEY",
    "StandaloneQuant",
    "act_precision",
    "fixed_act_quantizer",
    "fixed_weight_quantizer",
    "integer_ranges",
    "quantize_dequantize",
    "require_onnx",
    "weight_bits",
]
