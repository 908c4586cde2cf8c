"""`quantize(model, ...)`: swap Conv2d / Linear layers for fake-quant (QAT) modules.

Only Conv2d and Linear layers (and the activation tensor entering each) are quantized; everything
else (BatchNorm, LayerNorm, GeLU, sigmoid, pooling, ...) stays float, and so do the layers named in
`skip` and, on request, the first and/or last eligible layer (partial quantization, Dao ch. 4).
Conv2d layers the integer path cannot express (groups > 1, dilation > 1, unequal strides or
paddings, non-zero padding modes) stay float with a warning.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterable

from torch import nn

from .modules import QUANT_MODULES, ActQuantizer, QuantConv2d, QuantLinear, WeightQuantizer
from .observers import check_method
from .precision_mix import AdaptivePrecision


def _check_bits(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int in 1..8, got {v!r}")
    if not 1 <= v <= 8:
        raise ValueError(f"{name} must be in 1..8, got {v}")
    return v


def _check_positive(name: str, v: object, kind: type = int) -> None:
    ok = isinstance(v, (int, float)) if kind is float else isinstance(v, int)
    if isinstance(v, bool) or not ok:
        raise TypeError(f"{name} must be a positive {kind.__name__}, got {v!r}")
    if not v > 0:
        raise ValueError(f"{name} must be > 0, got {v}")


def _check_options(threshold: float, percentile: float, tau: int, eta: int, bins: int,
                   momentum: float, beta: float, mix_until: int | None) -> None:
    for name, v in (("tau", tau), ("eta", eta), ("bins", bins)):
        _check_positive(name, v)
    for name, v in (("threshold", threshold), ("percentile", percentile),
                    ("momentum", momentum), ("beta", beta)):
        _check_positive(name, v, float)
    if not threshold < 1:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    if not percentile <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    if not momentum <= 1:
        raise ValueError(f"momentum must be in (0, 1], got {momentum}")
    if bins < 16 or bins & (bins - 1):
        raise ValueError(f"bins must be a power of two >= 16, got {bins}")
    if mix_until is not None and (isinstance(mix_until, bool) or not isinstance(mix_until, int)
                                  or mix_until < 0):
        raise ValueError(f"mix_until must be None or an int >= 0, got {mix_until!r}")


def conv_unsupported_reason(conv: nn.Conv2d) -> str | None:
    """Why the integer conv (ConvWorkload: square stride, symmetric zero pad) cannot run it."""
    if conv.groups != 1:
        return f"groups={conv.groups}"
    if tuple(conv.dilation) != (1, 1):
        return f"dilation={tuple(conv.dilation)}"
    if conv.stride[0] != conv.stride[1]:
        return f"stride={tuple(conv.stride)}"
    if isinstance(conv.padding, str) or conv.padding[0] != conv.padding[1]:
        return f"padding={conv.padding!r}"
    if conv.padding_mode != "zeros":
        return f"padding_mode={conv.padding_mode!r}"
    return None


def eligible_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Float Conv2d / Linear layers of `model` in registration order."""
    return [(n, m) for n, m in model.named_modules() if type(m) in (nn.Conv2d, nn.Linear)]


def quant_layers(model: nn.Module) -> list[tuple[str, QuantConv2d | QuantLinear]]:
    """The fake-quant layers of a quantized model, in registration order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, QUANT_MODULES)]


def _check_skip(skip: object, names: list[str]) -> list[str]:
    if isinstance(skip, str) or not isinstance(skip, Iterable):
        raise TypeError(f"skip must be a list of module names, got {skip!r}")
    skip = list(skip)
    for s in skip:
        if not isinstance(s, str):
            raise TypeError(f"skip must hold module names (str), got {s!r}")
        if not any(n == s or n.startswith(s + ".") for n in names):
            raise ValueError(f"skip names {s!r}, which is no Conv2d/Linear layer (or container "
                             f"of one) of the model; layers: {', '.join(names) or 'none'}")
    return skip


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def quantize_model(model: nn.Module, weight_bits: int = 8, act_bits: int = 8, method: str = "max",
             mix: bool = False, skip: Iterable[str] = (), skip_first: bool = False,
             skip_last: bool = False, *, inplace: bool = False, threshold: float = 1e-5,
             percentile: float = 99.99, tau: int = 10, eta: int = 5, bins: int = 2048,
             momentum: float = 0.1, beta: float = 4.0,
             mix_until: int | None = None) -> nn.Module:
    """Model with its Conv2d / Linear layers replaced by fake-quant modules (a copy unless
    `inplace`).

    weight_bits / act_bits: 1..8 (1-bit weights are binary -1/+1). method: observer of the clip
    ("max", "percentile", "mse", "rand"; thesis Eq. 4.3-4.5 and the stochastic scale). mix: give
    every activation the adaptive training precision (precision_mix.py; beta, mix_until in
    training steps). threshold: Rand's tail fraction (1e-5 = 0.001%). percentile: percentile
    method's level in percent. tau / eta: histogram refresh period (steps) and averaging window
    (refreshes). bins: histogram bins. momentum: EMA factor of the activation maximum.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_bits("weight_bits", weight_bits)
    _check_bits("act_bits", act_bits)
    check_method(method)
    for name, v in (("mix", mix), ("skip_first", skip_first), ("skip_last", skip_last),
                    ("inplace", inplace)):
        if not isinstance(v, bool):
            raise TypeError(f"{name} must be a bool, got {v!r}")
    _check_options(threshold, percentile, tau, eta, bins, momentum, beta, mix_until)
    if quant_layers(model):
        raise ValueError("model is already quantized (it holds lowbit fake-quant layers)")
    layers = eligible_layers(model)
    names = [n for n, _ in layers]
    skipped = set(_check_skip(skip, names))
    if not inplace:
        model = copy.deepcopy(model)
        layers = eligible_layers(model)
    chosen = []
    for i, (name, layer) in enumerate(layers):
        if any(name == s or name.startswith(s + ".") for s in skipped):
            continue
        if (skip_first and i == 0) or (skip_last and i == len(layers) - 1):
            continue
        if isinstance(layer, nn.Conv2d) and (why := conv_unsupported_reason(layer)):
            warnings.warn(f"lowbit.quantize: {name} stays float ({why} has no integer conv)",
                          stacklevel=2)
            continue
        chosen.append((name, layer))
    for name, layer in chosen:
        sched = AdaptivePrecision(act_bits, beta=beta, until=mix_until) if mix else None
        act = ActQuantizer(act_bits, method, mix=sched, bins=bins, momentum=momentum, tau=tau,
                           eta=eta, threshold=threshold, percentile=percentile)
        wq = WeightQuantizer(weight_bits, method, threshold=threshold, percentile=percentile)
        cls = QuantConv2d if isinstance(layer, nn.Conv2d) else QuantLinear
        _set_module(model, name, cls.from_float(layer, wq, act))
    return model


def precision_schedule(model: nn.Module) -> dict[str, list[tuple[int, int]]]:
    """Per quantized layer: the (training step, activation bits) history of its mix schedule
    (a constant [(0, bits)] for layers without one)."""
    out = {}
    for name, layer in quant_layers(model):
        mix = layer.act_quant.mix
        out[name] = list(mix.history) if mix is not None else [(0, layer.act_quant.bits)]
    return out
