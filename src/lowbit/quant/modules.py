"""Fake-quant (QAT) modules: quantizers for weights and activations, and the Conv2d / Linear that
use them. Forward: dequantize(quantize(.)) with round half up; backward: straight-through estimator
(clipped), see `lowbit.quant.quantize.fake_quantize`.

Encodings (`lowbit.core.Precision`): weights signed symmetric per output channel (binary -1/+1
with scale mean|w| at 1 bit); activations unsigned when the tensor is non-negative (after a ReLU),
signed otherwise (binary at 1 bit), one scale per tensor. The activation encoding is fixed by the
first tensor observed (any negative value -> signed; in calibration: any batch).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core import Precision
from .observers import channel_clip, check_method, magnitudes, make_observer
from .precision_mix import AdaptivePrecision
from .quantize import fake_quantize, quantize, round_half_up, scale_from_max

_UNKNOWN, _UNSIGNED, _SIGNED = -1, 0, 1
# float32 holds 24 significant bits: a finer quantizer than that is the identity
_IDENTITY_BITS = 24


def weight_precision(bits: int) -> Precision:
    """Signed symmetric weights; binary (-1/+1) at 1 bit."""
    return Precision(1, "binary") if bits == 1 else Precision(bits, "signed")


def activation_precision(bits: int, signed: bool) -> Precision:
    """Unsigned for non-negative tensors; signed (binary at 1 bit) otherwise."""
    if not signed:
        return Precision(bits, "unsigned")
    return Precision(1, "binary") if bits == 1 else Precision(bits, "signed")


class _WideSTE(torch.autograd.Function):
    """Quantize-dequantize above 8 bits (mix training precisions), straight-through backward."""

    @staticmethod
    def forward(ctx, x, scale, qmin, qmax):  # type: ignore[override]
        return torch.clamp(round_half_up(x / scale), qmin, qmax) * scale

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad, None, None, None


class WeightQuantizer(nn.Module):
    """Per-output-channel (dim 0) weight fake-quantizer; clip from `method` (observers.py)."""

    def __init__(self, bits: int, method: str = "max", threshold: float = 1e-5,
                 percentile: float = 99.99) -> None:
        super().__init__()
        self.prec = weight_precision(bits)
        self.method = check_method(method)
        self.threshold, self.percentile = threshold, percentile

    def scale(self, w: torch.Tensor, stochastic: bool = False) -> torch.Tensor:
        """float32 [K] scales; stochastic draws the Rand clip (training only)."""
        if self.prec.bits == 1:
            return scale_from_max(w.detach().float(), self.prec, axis=0)
        clip = channel_clip(w, self.method, self.prec.qmax, self.prec.qmin, stochastic,
                            self.threshold, self.percentile)
        return clip / self.prec.qmax

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        s = self.scale(w, stochastic=self.training).to(w.dtype)
        return fake_quantize(w, s, self.prec, axis=0)

    def integer(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Deterministic (int8 values in prec's range, float32 [K] scales) of a weight tensor."""
        s = self.scale(w)
        return quantize(w.detach().float(), s, self.prec, axis=0), s

    def extra_repr(self) -> str:
        return f"{self.prec}, method={self.method}"


class ActQuantizer(nn.Module):
    """Per-tensor activation fake-quantizer with an observer and an optional training-precision
    schedule (`mix`, precision_mix.py). States: QAT (default: observes in training mode),
    `calibrating` (observes every batch, passes x through unchanged), `frozen` (no updates)."""

    def __init__(self, bits: int, method: str = "max", signed: bool | None = None,
                 mix: AdaptivePrecision | None = None, *, bins: int = 2048,
                 momentum: float = 0.1, tau: int = 10, eta: int = 5, threshold: float = 1e-5,
                 percentile: float = 99.99) -> None:
        super().__init__()
        self.bits, self.method, self.mix, self.momentum = bits, check_method(method), mix, momentum
        self.observer = make_observer(method, bins=bins, momentum=momentum, tau=tau, eta=eta,
                                      threshold=threshold, percentile=percentile)
        code = _UNKNOWN if signed is None else (_SIGNED if signed else _UNSIGNED)
        self.register_buffer("encoding_code", torch.tensor(code))
        self.register_buffer("mean_abs", torch.zeros((), dtype=torch.float64))
        self.calibrating = False
        self.frozen = False
        activation_precision(bits, True)  # validates bits

    @property
    def signed(self) -> bool | None:
        code = int(self.encoding_code)
        return None if code == _UNKNOWN else code == _SIGNED

    def precision(self, bits: int | None = None) -> Precision:
        """Precision at `bits` (default: the deployed bits) for this tensor's encoding."""
        if self.signed is None:
            raise RuntimeError("activation quantizer has not seen data yet: its encoding is "
                               "unknown (train it or run lowbit.calibrate first)")
        return activation_precision(self.bits if bits is None else bits, self.signed)

    @property
    def training_bits(self) -> int:
        """Precision the forward uses now: the mix schedule while training with live statistics,
        else the deployed bits (a frozen quantizer's schedule cannot move)."""
        live = self.mix is not None and self.training and not self.frozen
        return self.mix.bits if live else self.bits

    def scale(self, bits: int | None = None, stochastic: bool = False) -> float:
        """Scale (real units per integer step) at `bits`; deterministic unless stochastic."""
        if int(self.observer.seen) == 0:
            raise RuntimeError("activation quantizer has no range yet: train the model (QAT) "
                               "or run lowbit.calibrate(model, loader) first")
        bits = self.bits if bits is None else bits
        if self.signed and bits == 1:
            return max(float(self.mean_abs), 1e-12)
        qmin, qmax = _range(bits, bool(self.signed))
        return self.observer.clip(qmax, qmin, stochastic) / qmax

    @torch.no_grad()
    def _observe(self, x: torch.Tensor) -> None:
        neg = bool(x.numel()) and float(x.min()) < 0
        if self.calibrating:
            if neg or self.signed is None:
                self.encoding_code.fill_(_SIGNED if neg else _UNSIGNED)
            m = x.detach().float().abs().reshape(-1)
            self.observer.accumulate(m)
            # running mean over the calibration batches (binary activations' scale)
            n = self.observer.samples
            self.mean_abs.add_((m.double().sum() - self.mean_abs * m.numel()) / max(n, 1))
            return
        if self.signed is None:
            self.encoding_code.fill_(_SIGNED if neg else _UNSIGNED)
        m = magnitudes(x, bool(self.signed))
        first = int(self.observer.seen) == 0
        self.observer.observe(m)
        mean = m.mean().double()
        self.mean_abs.copy_(mean if first else self.mean_abs * (1 - self.momentum)
                            + self.momentum * mean)
        obs = self.observer
        if self.mix is not None and (obs.steps - 1) % obs.tau == 0:
            self.mix.signed = bool(self.signed)
            qmin, qmax = _range(self.bits, bool(self.signed))
            self.mix.step(obs.steps - 1, obs.rel, obs.fraction(qmax, qmin), obs.samples)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.calibrating:
            self._observe(x)
            return x
        if self.training and not self.frozen:
            self._observe(x)
        bits = self.training_bits
        stochastic = self.training and not self.frozen
        s = self.scale(bits, stochastic)
        if bits >= _IDENTITY_BITS:
            return x
        if bits > 8:
            qmin, qmax = _range(bits, bool(self.signed))
            return _WideSTE.apply(x, s, qmin, qmax)
        return fake_quantize(x, torch.tensor(s, dtype=x.dtype, device=x.device),
                             self.precision(bits))

    def extra_repr(self) -> str:
        enc = {None: "auto", True: "signed", False: "unsigned"}[self.signed]
        mix = ", mix" if self.mix is not None else ""
        return f"bits={self.bits}, {enc}, method={self.method}{mix}"


def _range(bits: int, signed: bool) -> tuple[int, int]:
    """(qmin, qmax) of a b-bit quantizer of any width (1..32)."""
    if signed and bits > 1:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return (-1, 1) if signed else (0, (1 << bits) - 1)


class QuantConv2d(nn.Conv2d):
    """Conv2d on fake-quantized input and per-channel fake-quantized weights (float bias)."""

    weight_quant: WeightQuantizer
    act_quant: ActQuantizer

    @classmethod
    def from_float(cls, conv: nn.Conv2d, weight_quant: WeightQuantizer,
                   act_quant: ActQuantizer) -> QuantConv2d:
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                  conv.padding, conv.dilation, conv.groups, conv.bias is not None,
                  conv.padding_mode, device=conv.weight.device, dtype=conv.weight.dtype)
        new.load_state_dict(conv.state_dict())
        new.train(conv.training)
        new.weight_quant, new.act_quant = weight_quant, act_quant
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(self.act_quant(x), self.weight_quant(self.weight), self.bias)


class QuantLinear(nn.Linear):
    """Linear on fake-quantized input and per-channel fake-quantized weights (float bias)."""

    weight_quant: WeightQuantizer
    act_quant: ActQuantizer

    @classmethod
    def from_float(cls, linear: nn.Linear, weight_quant: WeightQuantizer,
                   act_quant: ActQuantizer) -> QuantLinear:
        new = cls(linear.in_features, linear.out_features, linear.bias is not None,
                  device=linear.weight.device, dtype=linear.weight.dtype)
        new.load_state_dict(linear.state_dict())
        new.train(linear.training)
        new.weight_quant, new.act_quant = weight_quant, act_quant
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.act_quant(x), self.weight_quant(self.weight), self.bias)


QUANT_MODULES = (QuantConv2d, QuantLinear)
