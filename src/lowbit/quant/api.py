"""`quantize(model, ...)`: swap Conv2d / Linear layers for fake-quant (QAT) modules.

Only Conv2d and Linear layers (and the activation tensor entering each) are quantized; everything
else (BatchNorm, LayerNorm, GeLU, sigmoid, pooling, ...) stays float, and so do the layers named in
`skip` and, on request, the first and/or last eligible layer (partial quantization, Dao ch. 4).
`layers` sets the precision, method or mix of single layers or globs of them. Layers lowbit
cannot run (Conv2d with dilation > 1, unequal strides or paddings, non-zero padding modes;
subclasses of Conv2d / Linear, whose forward may differ; other conv types) stay float with
one warning naming them. Every float layer carries its reason (`lowbit_float_reason`, shown by
`lowbit.summary`); a model with nothing to quantize is an error.
"""

from __future__ import annotations

import copy
import fnmatch
import warnings
from collections.abc import Iterable, Mapping

from torch import nn

from .guards import check_nonfinite_mode
from .learned import check_quantize_method
from .modules import QUANT_MODULES, QuantConv2d, QuantLinear
from .observers import METHODS
from .recipe import LayerRecipe, MixRecipe, build_quant_layer
from .residual import (
    ACTIVATION_BITS,
    ValueQuantizer,
    add_activation_quantizers,
    add_residual_quantizers,
    check_residual_bits,
)
from .residual import ATTR as RESIDUAL_ATTR

#: attribute set on every Conv2d / Linear that quantize leaves float: why it did
FLOAT_REASON = "lowbit_float_reason"
SKIPPED_BY_USER = "skipped by the user"
LAYER_KEYS = ("weight_bits", "act_bits", "method", "mix", "float")
#: warm-up share of training for mix schedules sized from train_steps
MIX_WARMUP = 0.25


def _check_bits(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int in 1..8, got {v!r}")
    if not 1 <= v <= 8:
        raise ValueError(f"{name} must be in 1..8, got {v}")
    return v


def _check_bool(name: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {v!r}")
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
    """Why the integer conv (ConvWorkload: square stride, symmetric zero pad, any groups)
    cannot run it."""
    if tuple(conv.dilation) != (1, 1):
        return f"dilation={tuple(conv.dilation)}"
    if conv.stride[0] != conv.stride[1]:
        return f"stride={tuple(conv.stride)}"
    if isinstance(conv.padding, str) or conv.padding[0] != conv.padding[1]:
        return f"padding={conv.padding!r}"
    if conv.padding_mode != "zeros":
        return f"padding_mode={conv.padding_mode!r}"
    return None


_LAYER_TYPES = (nn.modules.conv._ConvNd, nn.Linear, nn.Bilinear)


def is_layer(m: nn.Module) -> bool:
    """A conv or linear layer of any kind (what summary lists and quantize considers)."""
    return isinstance(m, _LAYER_TYPES)


def unsupported_reason(m: nn.Module) -> str | None:
    """Why lowbit cannot quantize this (float) layer, or None for a plain Conv2d / Linear it
    can run."""
    if type(m) is nn.Conv2d:
        why = conv_unsupported_reason(m)
        return f"{why} (no integer conv)" if why else None
    if type(m) is nn.Linear:
        return None
    for base in (nn.Conv2d, nn.Linear):
        if isinstance(m, base):
            return (f"{base.__name__} subclass {type(m).__name__} (its forward may differ from "
                    f"{base.__name__}'s)")
    return f"{type(m).__name__} (only Conv2d and Linear are quantized)"


def eligible_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Float Conv2d / Linear layers of `model` in registration order."""
    return [(n, m) for n, m in model.named_modules() if type(m) in (nn.Conv2d, nn.Linear)]


def candidate_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every float conv / linear layer of `model` (supported or not), registration order."""
    return [(n, m) for n, m in model.named_modules()
            if is_layer(m) and not isinstance(m, QUANT_MODULES)]


def quant_layers(model: nn.Module) -> list[tuple[str, QuantConv2d | QuantLinear]]:
    """The fake-quant layers of a quantized model, in registration order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, QUANT_MODULES)]


def _matches(name: str, pattern: str) -> bool:
    return name == pattern or name.startswith(pattern + ".") or fnmatch.fnmatchcase(name,
                                                                                     pattern)


def _check_skip(skip: object, names: list[str]) -> list[str]:
    if isinstance(skip, str) or not isinstance(skip, Iterable):
        raise TypeError(f"skip must be a list of module names, got {skip!r}")
    skip = list(skip)
    for s in skip:
        if not isinstance(s, str):
            raise TypeError(f"skip must hold module names (str), got {s!r}")
        if not any(_matches(n, s) for n in names):
            raise ValueError(f"skip names {s!r}, which is no Conv2d/Linear layer (or container "
                             f"of one) of the model; layers: {', '.join(names) or 'none'}")
    return skip


def _check_overrides(layers: object, names: list[str]) -> dict[str, dict]:
    """Validated `layers` argument: {name or glob: {key: value}} (module doc)."""
    if layers is None:
        return {}
    if not isinstance(layers, Mapping):
        raise TypeError("layers must be a dict {layer name or glob: dict(weight_bits=..., "
                        f"act_bits=..., method=...)}}, got {type(layers).__name__}")
    out = {}
    for pattern, opts in layers.items():
        where = f"layers[{pattern!r}]"
        if not isinstance(pattern, str):
            raise TypeError(f"layers keys must be layer names or globs (str), got {pattern!r}")
        if not isinstance(opts, Mapping):
            raise TypeError(f"{where} must be a dict of {', '.join(LAYER_KEYS)}, got {opts!r}")
        for key, v in opts.items():
            if key not in LAYER_KEYS:
                raise ValueError(f"{where}: unknown key {key!r} (allowed: "
                                 f"{', '.join(LAYER_KEYS)})")
            try:
                if key in ("weight_bits", "act_bits"):
                    _check_bits(key, v)
                elif key == "method":
                    check_quantize_method(v)
                else:
                    _check_bool(key, v)
            except (TypeError, ValueError) as e:
                raise type(e)(f"{where}: {e}") from None
        if not any(_matches(n, pattern) for n in names):
            raise ValueError(f"{where}: the pattern matches no Conv2d/Linear layer; layers: "
                             f"{', '.join(names) or 'none'}")
        out[pattern] = dict(opts)
    return out


def _set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def _check_training_length(mix_used: bool, train_steps: object, mix_warmup: object,
                           mix_until: int | None) -> int | None:
    """End of the mix warm-up in steps (None without mix)."""
    if train_steps is not None and (isinstance(train_steps, bool)
                                    or not isinstance(train_steps, int) or train_steps < 1):
        raise ValueError(f"train_steps must be None or an int >= 1, got {train_steps!r}")
    if isinstance(mix_warmup, bool) or not isinstance(mix_warmup, (int, float)) \
            or not 0 < mix_warmup < 1:
        raise ValueError(f"mix_warmup must be in (0, 1), got {mix_warmup!r}")
    if not mix_used:
        return None
    if mix_until is not None:
        return mix_until
    if train_steps is None:
        raise ValueError("mix=True needs train_steps: the number of QAT training steps you will "
                         "run (e.g. epochs * len(loader)); the precision warm-up takes the first "
                         f"{mix_warmup:.0%} of them, so every layer trains at its deployed "
                         "precision for the rest")
    return max(1, round(mix_warmup * train_steps))


def quantize_model(model: nn.Module, weight_bits: int = 8, act_bits: int = 8, method: str = "max",
                   mix: bool = False, skip: Iterable[str] = (), skip_first: bool = False,
                   skip_last: bool = False, *, layers: Mapping[str, Mapping] | None = None,
                   train_steps: int | None = None, mix_warmup: float = MIX_WARMUP,
                   nonfinite: str = "raise", inplace: bool = False, threshold: float = 1e-5,
                   percentile: float = 99.99, tau: int = 10, eta: int = 5, bins: int = 2048,
                   momentum: float = 0.1, beta: float = 4.0,
                   mix_until: int | None = None, residual_bits: int | None = None,
                   residual_layers: Mapping[str, int | None] | None = None,
                   activation_bits: int | None = 8) -> nn.Module:
    """Model with its Conv2d / Linear layers replaced by fake-quant modules (a copy unless
    `inplace`).

    weight_bits / act_bits: 1..8 (1-bit weights are binary -1/+1). method: observer of the clip
    ("max", "percentile", "mse", "rand"; thesis Eq. 4.3-4.5 and the stochastic scale) or a
    learned one ("lsq", "pact"; learned.py, which says how they combine with mix and Rand).
    layers: per-layer settings {name or glob: dict(weight_bits=, act_bits=, method=, mix=,
    float=)}; patterns apply in order, later ones win key by key; float=True keeps a layer
    float. mix: give every activation the adaptive training precision (precision_mix.py); it
    needs `train_steps` (QAT training steps you will run; the warm-up is the first
    `mix_warmup` of them) or an explicit `mix_until` step. nonfinite: "raise" (ValueError
    naming the layer on NaN / inf input) or "clamp" (NaN -> 0, +-inf -> the clip).
    threshold: Rand's tail fraction (1e-5 = 0.001%). percentile: percentile method's level in
    percent. tau / eta: histogram refresh period (steps) and averaging window (refreshes).
    bins: histogram bins. momentum: EMA factor of the activation maximum. beta: mix step size.
    residual_bits: None (residual adds stay float in the model: the engine realizes them
    wide), 4, 8 or 16: the values residual adds read (the stream between blocks, shortcuts that
    change the scale) are quantized in the model itself (`lowbit.quant.residual`: trained
    with, realized exactly by `convert` and `compile`); residual_layers: per-module overrides
    {module name or glob: bits or None}, e.g. {"layer1.*": 16}.
    activation_bits: 2..8 (default 8) or None: the input of every activation function that
    the engine computes as a table of its quantized input (hardswish, SiLU, sigmoid,
    hardsigmoid, GELU, tanh, ...; `lowbit.quant.residual.activation_points`) and that reads a
    quantized conv / linear is quantized in the model at this width (a forward pre-hook), and
    so is the feature map that such an activation scales (squeeze-excite over a ReLU map:
    MobileNet-V3, RegNet-Y), so that the compiled network computes them exactly on its
    integer path; None leaves them float (the engine then runs them in float). A model
    torch.fx cannot trace keeps them float (a warning).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    _check_bits("weight_bits", weight_bits)
    _check_bits("act_bits", act_bits)
    check_quantize_method(method)
    for name, v in (("mix", mix), ("skip_first", skip_first), ("skip_last", skip_last),
                    ("inplace", inplace)):
        _check_bool(name, v)
    check_nonfinite_mode(nonfinite)
    _check_options(threshold, percentile, tau, eta, bins, momentum, beta, mix_until)
    res_bits, res_overrides = check_residual_bits(residual_bits, residual_layers)
    if activation_bits is not None and (isinstance(activation_bits, bool) or not isinstance(
            activation_bits, int) or activation_bits not in ACTIVATION_BITS):
        raise ValueError(f"activation_bits must be None or an int in 2..8, got "
                         f"{activation_bits!r}")
    if quant_layers(model):
        raise ValueError("model is already quantized (it holds lowbit fake-quant layers)")
    names = [n for n, _ in candidate_layers(model)]
    skipped = _check_skip(skip, names)
    overrides = _check_overrides(layers, names)
    if not inplace:
        model = copy.deepcopy(model)
    plain = [n for n, _ in eligible_layers(model)]
    default = {"weight_bits": weight_bits, "act_bits": act_bits, "method": method, "mix": mix,
               "float": False}
    plans: dict[str, dict] = {}
    reasons: dict[str, str] = {}
    for name, layer in candidate_layers(model):
        opts = dict(default)
        for pattern, o in overrides.items():
            if _matches(name, pattern):
                opts.update(o)
        if any(_matches(name, s) for s in skipped) or opts["float"]:
            reasons[name] = SKIPPED_BY_USER
        elif skip_first and plain and name == plain[0]:
            reasons[name] = "first layer (skip_first)"
        elif skip_last and plain and name == plain[-1]:
            reasons[name] = "last layer (skip_last)"
        elif why := unsupported_reason(layer):
            reasons[name] = why
        else:
            plans[name] = opts
    if not plans:
        detail = "; ".join(f"{n}: {r}" for n, r in reasons.items()) or "it has no Conv2d or " \
            "Linear layer"
        raise ValueError(f"nothing to quantize in this {type(model).__name__}: {detail}")
    forced = {n: r for n, r in reasons.items() if r == SKIPPED_BY_USER or "skip_" in r}
    unsupported = {n: r for n, r in reasons.items() if n not in forced}
    if unsupported:
        warnings.warn("lowbit.quantize: these layers stay float: " + "; ".join(
            f"{n} ({r})" for n, r in unsupported.items()), stacklevel=2)
    until = _check_training_length(any(p["mix"] for p in plans.values()), train_steps,
                                   mix_warmup, mix_until)
    mods = dict(model.named_modules())
    for name, why in reasons.items():
        setattr(mods[name], FLOAT_REASON, why)
    observer = {"bins": bins, "momentum": momentum, "tau": tau, "eta": eta}
    for name, p in plans.items():
        recipe = LayerRecipe(p["weight_bits"], p["act_bits"], p["method"],
                             MixRecipe(beta, until) if p["mix"] else None, nonfinite, threshold,
                             percentile, observer)
        _set_module(model, name, build_quant_layer(mods[name], name, recipe))
    res_method = method if method in METHODS else "max"

    def make(name: str, bits: int) -> ValueQuantizer:
        return ValueQuantizer(bits, res_method, threshold=threshold, percentile=percentile,
                              nonfinite=nonfinite, layer_name=name, **observer)

    if res_bits is not None or res_overrides:
        add_residual_quantizers(model, res_bits, res_overrides,
                                lambda module, bits: make(f"{module}.{RESIDUAL_ATTR}", bits))
    if activation_bits is not None:
        left = add_activation_quantizers(model, activation_bits, make)
        if left and any(why.startswith("activation inputs stay float") for why in left):
            warnings.warn(f"lowbit.quantize: {left[0]}", stacklevel=2)
    return model


def precision_schedule(model: nn.Module) -> dict[str, list[tuple[int, int]]]:
    """Per quantized layer: the (training step, activation bits) history of its mix schedule
    (a constant [(0, bits)] for layers without one)."""
    out = {}
    for name, layer in quant_layers(model):
        mix = layer.act_quant.mix
        out[name] = list(mix.history) if mix is not None else [(0, layer.act_quant.bits)]
    return out
