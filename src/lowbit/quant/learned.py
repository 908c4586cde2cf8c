"""Learned quantizers: LSQ (learned step size) and PACT (learned activation clip).

LSQ (Esser et al., ICLR 2020): the step s is a trained parameter. Forward (our rounding, the
same as every lowbit quantizer): v_hat = clamp(round_half_up(v / s), -Qn, Qp) * s. Backward:
    dv_hat/dv = 1 if -Qn < v/s < Qp else 0                                   (STE)
    dv_hat/ds = round(v/s) - v/s inside, -Qn below, Qp above, times g = 1 / sqrt(N * Qp)
where N is the number of elements one step quantizes per example: a weight channel's elements
(per-output-channel steps; the paper has one step per layer and N = the layer's weights) or an
activation's features (numel / batch). Initial step 2 <|v|> / sqrt(Qp) (per weight channel;
for activations from the first training batch or the calibration mean). At 1 bit (binary
-1/+1, lowbit's encoding) v_hat = s * sign(v), dv_hat/ds = sign(v), initial s = <|v|> (the
XNOR-Net scale), STE inside |v| <= s.

PACT (Choi et al., 2018): the activation clip alpha is a trained parameter, y = clip(x, 0, alpha)
quantized with step alpha / Qp. Backward: dy/dx = 1 inside (0, alpha), dy/dalpha = 1 where
x >= alpha (the paper's STE; signed tensors clip at [qmin s, alpha] and give qmin / Qp below).
alpha starts at the clip minimizing the quantization MSE of the first batch's (or the
calibration's) magnitude histogram at the deployed bits (lowbit's "mse" clip); the paper starts
at 10 and trains from scratch, which a short fine-tune from FP32 cannot afford (at 2 bits a clip
at the maximum leaves most activations in the lowest level). `pact_penalty` is the optional L2
regularizer of alpha. Weights under PACT use lowbit's per-channel MAX quantizer (the paper
pairs PACT with DoReFa weights; keeping MAX isolates what the learned clip does).

Combinations with the other methods (`lowbit.quantize(method=..., mix=...)`):
- PACT + mix: yes. alpha is a clip, independent of the bit width, so the adaptive training
  precision can move the bits under it (scale alpha / Qp(b) at every b); the mix divergence is
  taken at the learned clip.
- LSQ + mix: no (ValueError). The step is learned for one Qp; a schedule that trains at 12 bits
  and then drops to 2 would hand the 2-bit quantizer a step learned for a grid 1000x finer.
- LSQ or PACT + Rand: no (one method per layer). Rand, like MAX, chooses the clip from
  statistics; a learned step or clip replaces exactly that choice, and a stochastic draw on top
  would perturb the parameter the gradient is training. Per-layer mixes (e.g. Rand on one layer,
  LSQ on another) go through quantize's `layers=`.
Both convert to the same integer layers: scale() returns the learned step (alpha / Qp for PACT).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..core import Encoding, Precision
from .guards import check_scale, check_weights
from .modules import (
    _IDENTITY_BITS,
    ActQuantizer,
    QuantConv2d,
    QuantLinear,
    WeightQuantizer,
    _range,
)
from .observers import METHODS, MaxObserver, mse_fraction
from .precision_mix import AdaptivePrecision
from .quantize import _broadcast, round_half_up

LEARNED_METHODS = ("lsq", "pact")
#: every method `lowbit.quantize` accepts
QUANTIZE_METHODS = (*METHODS, *LEARNED_METHODS)
#: smallest step / clip a learned parameter is used at (keeps x / s finite)
_MIN_STEP = 1e-8


def check_quantize_method(method: object) -> str:
    """Validate a `lowbit.quantize` method name (observer methods and learned ones)."""
    if not isinstance(method, str) or method not in QUANTIZE_METHODS:
        raise ValueError(f"method must be one of {', '.join(QUANTIZE_METHODS)}, got {method!r}")
    return method


def lsq_grad_scale(elements: int, qmax: int) -> float:
    """LSQ's step gradient scale g = 1 / sqrt(N * Qp) (N: elements per step and example)."""
    return 1.0 / math.sqrt(max(elements, 1) * max(qmax, 1))


def _reduce_to(t: torch.Tensor, like: torch.Tensor, axis: int | None) -> torch.Tensor:
    """Sum `t` over every dim but `axis` (all dims for a per-tensor step) to like's shape."""
    if axis is None:
        return t.sum().reshape(like.shape)
    axis = axis % t.dim()
    return t.sum(dim=[d for d in range(t.dim()) if d != axis]).reshape(like.shape)


class _LSQ(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, step, qmin, qmax, grad_scale, axis, binary):  # type: ignore[override]
        s = _broadcast(step.to(x.dtype), x, axis)
        v = x / s
        if binary:
            q = torch.where(x >= 0, 1.0, -1.0).to(x.dtype)
            inside = v.abs() <= 1
        else:
            q = torch.clamp(round_half_up(v), qmin, qmax)
            inside = (v > qmin) & (v < qmax)
        ctx.save_for_backward(v, q, inside, step)
        ctx.grad_scale, ctx.axis, ctx.binary = grad_scale, axis, binary
        return q * s

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        v, q, inside, step = ctx.saved_tensors
        grad_x = grad * inside.to(grad.dtype)
        dq_ds = q if ctx.binary else torch.where(inside, q - v, q)
        grad_s = _reduce_to(grad * dq_ds, step, ctx.axis) * ctx.grad_scale
        return grad_x, grad_s.to(step.dtype), None, None, None, None, None


def lsq_fake_quantize(x: torch.Tensor, step: torch.Tensor, prec: Precision, grad_scale: float,
                      axis: int | None = None) -> torch.Tensor:
    """LSQ quantize-dequantize of x with step `step` (scalar, or one per index of `axis`);
    gradients to x (STE) and to step (times grad_scale), module doc."""
    binary = prec.encoding is Encoding.BINARY
    return _LSQ.apply(x, step, prec.qmin, prec.qmax, grad_scale, axis, binary)


class _PACT(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha, qmin, qmax, binary, wide):  # type: ignore[override]
        a = alpha.to(x.dtype)
        if binary:  # alpha * sign(x): every element moves with alpha
            d_alpha = torch.where(x >= 0, 1.0, -1.0).to(x.dtype)
            inside = x.abs() <= a
            out = d_alpha * a
        else:
            s = a / qmax
            lo = qmin * s
            inside = (x > lo) & (x < a)
            d_alpha = (x >= a).to(x.dtype) + (qmin / qmax) * (x <= lo).to(x.dtype)
            if wide:  # a grid finer than float32 resolves: clipping only
                out = torch.minimum(torch.maximum(x, lo), a)
            else:
                out = torch.clamp(round_half_up(x / s), qmin, qmax) * s
        ctx.save_for_backward(inside, d_alpha, alpha)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        inside, d_alpha, alpha = ctx.saved_tensors
        grad_alpha = (grad * d_alpha).sum().reshape(alpha.shape).to(alpha.dtype)
        return grad * inside.to(grad.dtype), grad_alpha, None, None, None, None


def pact_fake_quantize(x: torch.Tensor, alpha: torch.Tensor, bits: int,
                       signed: bool) -> torch.Tensor:
    """PACT quantize-dequantize of x at `bits`: clip to [qmin s, alpha], step s = alpha / Qp
    (binary at 1 bit when signed: alpha * sign(x)); gradients to x and alpha (module doc)."""
    qmin, qmax = _range(bits, signed)
    binary = signed and bits == 1
    return _PACT.apply(x, alpha, qmin, qmax, binary, bits >= _IDENTITY_BITS)


class LSQWeightQuantizer(WeightQuantizer):
    """Per-output-channel LSQ weight quantizer: `step_size` [K] is a parameter, initialized from the
    weights on first use (2 <|w|> / sqrt(Qp) per channel; <|w|> at 1 bit)."""

    def __init__(self, bits: int, channels: int, layer_name: str = "", **options: object) -> None:
        super().__init__(bits, "max", layer_name=layer_name, **options)
        self.method = "lsq"
        self.step_size = nn.Parameter(torch.ones(channels))
        self.register_buffer("initialized", torch.zeros((), dtype=torch.bool))

    @torch.no_grad()
    def _init_step(self, w: torch.Tensor) -> None:
        mean = w.detach().float().reshape(w.shape[0], -1).abs().mean(1)
        init = mean if self.prec.bits == 1 else 2 * mean / math.sqrt(self.prec.qmax)
        self.step_size.copy_(init.clamp_min(_MIN_STEP).to(self.step_size))
        self.initialized.fill_(True)

    def _step(self, w: torch.Tensor) -> torch.Tensor:
        check_weights(w, self.layer_name)
        if w.shape[0] != self.step_size.numel():
            raise ValueError(f"layer {self.layer_name}: {w.shape[0]} output channels, but the "
                             f"LSQ step has {self.step_size.numel()}")
        if not bool(self.initialized):
            self._init_step(w)
        return self.step_size.clamp_min(_MIN_STEP)

    def scale(self, w: torch.Tensor, stochastic: bool = False) -> torch.Tensor:
        """The learned float32 [K] steps (stochastic is ignored: LSQ has no random scale)."""
        return self._step(w).detach().float()

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        g = lsq_grad_scale(w[0].numel(), self.prec.qmax)
        return lsq_fake_quantize(w, self._step(w), self.prec, g, axis=0)


class _LearnedActQuantizer(ActQuantizer):
    """An activation quantizer whose scale is a parameter (`_value`), set from the statistics
    the base class observes when it is first needed (training or calibration)."""

    def __init__(self, bits: int, method: str, **options: object) -> None:
        super().__init__(bits, "max", **options)
        self.method = method
        self.register_buffer("initialized", torch.zeros((), dtype=torch.bool))

    def _param(self) -> nn.Parameter:
        raise NotImplementedError

    def _initial_value(self) -> float:
        raise NotImplementedError

    def _value(self) -> torch.Tensor:
        """The learned parameter (step or clip), initialized from the observed range first."""
        param = self._param()
        if not bool(self.initialized):
            if int(self.observer.seen) == 0:
                raise RuntimeError(f"{self._label()}: activation quantizer has no range yet: "
                                   "train the model (QAT) or run lowbit.calibrate first")
            with torch.no_grad():
                param.fill_(max(self._initial_value(), _MIN_STEP))
                self.initialized.fill_(True)
        return param.clamp_min(_MIN_STEP)


class LSQActQuantizer(_LearnedActQuantizer):
    """Per-tensor LSQ activation quantizer: `step_size` is a parameter, initialized to
    2 <|x|> / sqrt(Qp) (<|x|> at 1 bit) from the first training batch or the calibration data.
    Trains at its deployed bits only (no mix). `frozen` stops the observer, not the step size."""

    def __init__(self, bits: int, **options: object) -> None:
        super().__init__(bits, "lsq", **options)
        self.step_size = nn.Parameter(torch.ones(()))

    def _param(self) -> nn.Parameter:
        return self.step_size

    def _initial_value(self) -> float:
        mean = float(self.mean_abs)
        qmax = self.precision().qmax
        return mean if qmax == 1 and self.signed else 2 * mean / math.sqrt(qmax)

    def scale(self, bits: int | None = None, stochastic: bool = False) -> float:
        """The learned step (the deployed bits only; stochastic is ignored)."""
        if bits is not None and bits != self.bits:
            raise ValueError(f"{self._label()}: an LSQ step is learned for {self.bits} bits, "
                             f"not {bits}")
        return check_scale(float(self._value().detach().float()), self.layer_name)

    def fake_quant(self, x: torch.Tensor, bits: int, live: bool) -> torch.Tensor:
        prec = self.precision(bits)
        self.scale(bits)  # validates the step
        g = lsq_grad_scale(x[0].numel() if x.dim() > 1 else x.numel(), prec.qmax)
        return lsq_fake_quantize(x, self._value(), prec, g)


class _ClipObserver(MaxObserver):
    """MAX observer whose clip fraction (for the mix divergence) is the learned clip's."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.learned_fraction = 1.0

    def fraction(self, qmax: int, qmin: int = 0) -> float:
        return self.learned_fraction


class PACTActQuantizer(_LearnedActQuantizer):
    """Per-tensor PACT activation quantizer: `alpha` (the clip) is a parameter, initialized to
    the MSE-optimal clip of the first observed histogram at the deployed bits (mean |x| for
    binary); scale at b bits = alpha / Qp(b), so a mix schedule works."""

    def __init__(self, bits: int, **options: object) -> None:
        super().__init__(bits, "pact", **options)
        obs = self.observer
        self.observer = _ClipObserver(obs.bins, obs.momentum, obs.tau, obs.eta)
        self.alpha = nn.Parameter(torch.ones(()))

    def _param(self) -> nn.Parameter:
        return self.alpha

    def _initial_value(self) -> float:
        if self.signed and self.bits == 1:
            return float(self.mean_abs)
        qmin, qmax = _range(self.bits, bool(self.signed))
        return float(self.observer.top) * mse_fraction(self.observer.rel, qmax, qmin)

    def _scale_tensor(self, bits: int) -> torch.Tensor:
        a = self._value().detach().float()
        if self.signed and bits == 1:
            return a
        return a / _range(bits, bool(self.signed))[1]

    def scale(self, bits: int | None = None, stochastic: bool = False) -> float:
        """alpha / Qp at `bits` (default: the deployed bits); stochastic is ignored."""
        bits = self.bits if bits is None else bits
        return check_scale(float(self._scale_tensor(bits)), self.layer_name)

    def fake_quant(self, x: torch.Tensor, bits: int, live: bool) -> torch.Tensor:
        self.scale(bits)  # validates alpha
        alpha = self._value()
        top = float(self.observer.top)
        if top > 0:
            self.observer.learned_fraction = min(float(alpha.detach()) / top, 1.0)
        return pact_fake_quantize(x, alpha, bits, bool(self.signed))


def pact_penalty(model: nn.Module) -> torch.Tensor:
    """Sum of alpha^2 over the model's PACT quantizers (add `decay * pact_penalty(model)` to
    the loss for the paper's L2 regularization of the clips); 0 without PACT layers."""
    alphas = [m.alpha for m in model.modules() if isinstance(m, PACTActQuantizer)]
    if not alphas:
        return torch.zeros(())
    return torch.stack([a.pow(2) for a in alphas]).sum()


def learned_layer(layer: nn.Module, name: str, recipe: object,
                  mix: AdaptivePrecision | None) -> QuantConv2d | QuantLinear:
    """Fake-quant copy of the float Conv2d / Linear `layer` with LSQ or PACT quantizers
    (`recipe`: a quant.recipe.LayerRecipe whose method is in LEARNED_METHODS)."""
    method = recipe.method
    if method not in LEARNED_METHODS:
        raise ValueError(f"method must be one of {', '.join(LEARNED_METHODS)}, got {method!r}")
    if method == "lsq" and mix is not None:
        raise ValueError(f"layer {name}: method='lsq' cannot take mix=True (the step is learned "
                         "for the deployed bits); use method='pact' with mix, or mix=False")
    options = {"layer_name": name, "nonfinite": recipe.nonfinite, **recipe.observer}
    if method == "lsq":
        act: ActQuantizer = LSQActQuantizer(recipe.act_bits, **options)
        wq: WeightQuantizer = LSQWeightQuantizer(recipe.weight_bits, layer.weight.shape[0],
                                                 layer_name=name)
    else:
        act = PACTActQuantizer(recipe.act_bits, mix=mix, **options)
        wq = WeightQuantizer(recipe.weight_bits, "max", layer_name=name)
    act.to(layer.weight.device)
    wq.to(layer.weight.device)
    cls = QuantConv2d if isinstance(layer, nn.Conv2d) else QuantLinear
    return cls.from_float(layer, wq, act)


__all__ = ["LEARNED_METHODS", "QUANTIZE_METHODS", "LSQActQuantizer", "LSQWeightQuantizer",
           "PACTActQuantizer", "check_quantize_method", "learned_layer", "lsq_fake_quantize",
           "lsq_grad_scale", "pact_fake_quantize", "pact_penalty"]
