"""Fake-quant (QAT) modules: quantizers for weights and activations, and the Conv2d / Linear that
use them. Forward: dequantize(quantize(.)) with round half up; backward: straight-through estimator
(clipped), see `lowbit.quant.quantize.fake_quantize`.

Encodings (`lowbit.core.Precision`): weights signed symmetric per output channel (binary -1/+1
with scale mean|w| at 1 bit); activations unsigned when the tensor is non-negative (after a ReLU),
signed otherwise (binary at 1 bit), one scale per tensor. The activation encoding is fixed by the
first tensor observed (any negative value -> signed; in calibration: any batch).

Guards (guards.py): a non-finite input raises a ValueError naming the layer (`nonfinite="raise"`)
or is replaced ("clamp"); observers skip non-finite values and count them; every scale is
checked (finite, not vanishing) before use; NaN / inf weights always raise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core import Precision
from .guards import check_nonfinite_mode, check_scale, check_weights, guard_input
from .observers import channel_clip, check_method, finite_values, magnitudes, make_observer
from .precision_mix import AdaptivePrecision
from .quantize import dequantize, fake_quantize, quantize, round_half_up, scale_from_max

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
                 percentile: float = 99.99, layer_name: str = "") -> None:
        super().__init__()
        self.prec = weight_precision(bits)
        self.method = check_method(method)
        self.threshold, self.percentile = threshold, percentile
        self.layer_name = layer_name

    def scale(self, w: torch.Tensor, stochastic: bool = False) -> torch.Tensor:
        """float32 [K] scales; stochastic draws the Rand clip (training only). An all-zero
        channel gets the floor scale (its integers are 0 whatever the scale)."""
        check_weights(w, self.layer_name)
        if self.prec.bits == 1:
            return scale_from_max(w.detach().float(), self.prec, axis=0)
        clip = channel_clip(w, self.method, self.prec.qmax, self.prec.qmin, stochastic,
                            self.threshold, self.percentile)
        return clip / self.prec.qmax

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        s = self.scale(w, stochastic=self.training)
        out = fake_quantize(w.float(), s, self.prec, axis=0)
        if w.dtype == torch.float32:
            return out
        # another dtype (a model run in float64 to carry exact values): the integers as float32
        # computes them (`integer`: what convert and compile run; w / s in float64 can land on
        # the other side of a half step), times the scale in w's dtype; gradients as float32's
        exact = dequantize(quantize(w.detach().float(), s, self.prec, axis=0), s, axis=0,
                           dtype=w.dtype)
        return out.to(w.dtype) + (exact - out.to(w.dtype)).detach()

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
                 percentile: float = 99.99, layer_name: str = "",
                 nonfinite: str = "raise") -> None:
        super().__init__()
        self.bits, self.method, self.mix, self.momentum = bits, check_method(method), mix, momentum
        self.layer_name, self.nonfinite = layer_name, check_nonfinite_mode(nonfinite)
        self.observer = make_observer(method, bins=bins, momentum=momentum, tau=tau, eta=eta,
                                      threshold=threshold, percentile=percentile)
        code = _UNKNOWN if signed is None else (_SIGNED if signed else _UNSIGNED)
        self.register_buffer("encoding_code", torch.tensor(code))
        self.register_buffer("mean_abs", torch.zeros((), dtype=torch.float64))
        self.register_buffer("frozen_flag", torch.zeros((), dtype=torch.bool))
        # QAT steps trained at the deployed precision (convert refuses a mix layer with none)
        self.register_buffer("target_steps", torch.zeros((), dtype=torch.int64))
        self.calibrating = False
        self.precision_of(bits, True)  # validates bits

    @property
    def frozen(self) -> bool:
        """No statistics updates (set by lowbit.calibrate; saved with the model)."""
        return bool(self.frozen_flag)

    @frozen.setter
    def frozen(self, value: bool) -> None:
        self.frozen_flag.fill_(bool(value))

    @property
    def signed(self) -> bool | None:
        code = int(self.encoding_code)
        return None if code == _UNKNOWN else code == _SIGNED

    def precision_of(self, bits: int, signed: bool) -> Precision:
        """The Precision of `bits` for an encoding (`activation_precision`; ValueError outside
        the widths this quantizer deploys)."""
        return activation_precision(bits, signed)

    def precision(self, bits: int | None = None) -> Precision:
        """Precision at `bits` (default: the deployed bits) for this tensor's encoding."""
        if self.signed is None:
            raise RuntimeError("activation quantizer has not seen data yet: its encoding is "
                               "unknown (train it or run lowbit.calibrate first)")
        return self.precision_of(self.bits if bits is None else bits, self.signed)

    @property
    def step(self) -> int:
        """Index of the last QAT step observed (0-based; -1 before any)."""
        return int(self.observer.steps) - 1

    @property
    def training_bits(self) -> int:
        """Precision the forward uses now: the mix schedule (under its warm-up cap) while
        training with live statistics, else the deployed bits (a frozen quantizer's schedule
        cannot move)."""
        live = self.mix is not None and self.training and not self.frozen
        return self.mix.bits_at(max(self.step, 0)) if live else self.bits

    def _label(self) -> str:
        return f"layer {self.layer_name}" if self.layer_name else "activation quantizer"

    def scale(self, bits: int | None = None, stochastic: bool = False) -> float:
        """Scale (real units per integer step) at `bits`; deterministic unless stochastic.
        RuntimeError before any data; ValueError when the range is 0 (only zeros observed) or
        the scale is not a usable number (guards.check_scale)."""
        obs = self.observer
        if int(obs.seen) == 0:
            raise RuntimeError(f"{self._label()}: activation quantizer has no range yet: train "
                               "the model (QAT) or run lowbit.calibrate(model, loader) first")
        bits = self.bits if bits is None else bits
        if self.signed and bits == 1:
            s = float(self.mean_abs)
        else:
            qmin, qmax = _range(bits, bool(self.signed))
            s = obs.clip(qmax, qmin, stochastic) / qmax
        if s == 0.0:
            raise ValueError(
                f"{self._label()}: the activation range is 0: it observed only zeros "
                f"({int(obs.samples)} values behind its range, {int(obs.nonfinite)} non-finite "
                "skipped); train or calibrate on representative data, or keep the layer float")
        return check_scale(s, self.layer_name)

    @torch.no_grad()
    def _observe(self, x: torch.Tensor) -> None:
        x, bad = finite_values(x)
        self.observer.nonfinite += bad
        if x.numel() == 0:
            return
        neg = float(x.min()) < 0
        if self.calibrating:
            if neg or self.signed is None:
                self.encoding_code.fill_(_SIGNED if neg else _UNSIGNED)
            m = x.abs()
            self.observer.accumulate(m)
            # running mean over the calibration batches (binary activations' scale)
            n = int(self.observer.samples)
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
        if self.mix is not None and self.step % obs.tau == 0:
            self.mix.signed = bool(self.signed)
            qmin, qmax = _range(self.bits, bool(self.signed))
            self.mix.step(self.step, obs.rel, obs.fraction(qmax, qmin), int(obs.samples))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.nonfinite == "raise":
            guard_input(x, self.layer_name, "raise")
        if self.calibrating:
            self._observe(x)
            return x
        live = self.training and not self.frozen
        if live:
            self._observe(x)
        if self.nonfinite == "clamp":
            x = guard_input(x, self.layer_name, "clamp")
        if x.numel() == 0:
            return x
        if live and float(self.observer.top) == 0.0 and int(self.observer.seen) \
                and not bool(x.any()):
            return x  # only zeros so far: any scale gives these zeros back
        bits = self.training_bits
        if live:
            self.target_steps += int(bits == self.bits)
            if self.mix is not None:
                self.mix.note(max(self.step, 0), bits)
        return self.fake_quant(x, bits, live)

    def fake_quant(self, x: torch.Tensor, bits: int, live: bool) -> torch.Tensor:
        """Quantize-dequantize x at `bits` (live: training with statistics); the hook learned
        quantizers (learned.py) override."""
        s = self.scale(bits, stochastic=live)
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


class _QuantLayer:
    """Shared by QuantConv2d / QuantLinear: a `qlayout` buffer (int64 [2]: weight bits,
    activation bits) so that load_state_dict refuses a state of other precisions instead of
    loading scales and statistics that mean something else."""

    def _attach(self, weight_quant: WeightQuantizer, act_quant: ActQuantizer) -> None:
        self.weight_quant, self.act_quant = weight_quant, act_quant
        self.register_buffer("qlayout", torch.tensor([weight_quant.prec.bits, act_quant.bits]))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[override]
        got = state_dict.get(prefix + "qlayout")
        if got is not None and not torch.equal(got.cpu().long(), self.qlayout.cpu()):
            name = self.act_quant.layer_name or prefix.rstrip(".")
            raise ValueError(f"{name}: the state holds w{int(got[0])}a{int(got[1])}, but this "
                             f"layer is w{int(self.qlayout[0])}a{int(self.qlayout[1])}: load a "
                             "state of the same architecture and precisions")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class QuantConv2d(_QuantLayer, nn.Conv2d):
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
        new._attach(weight_quant, act_quant)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(self.act_quant(x), self.weight_quant(self.weight), self.bias)


class QuantLinear(_QuantLayer, nn.Linear):
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
        new._attach(weight_quant, act_quant)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.act_quant(x), self.weight_quant(self.weight), self.bias)


QUANT_MODULES = (QuantConv2d, QuantLinear)
