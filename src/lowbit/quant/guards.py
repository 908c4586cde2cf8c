"""Guards on the values that enter a quantizer and the scales that leave it.

Non-finite inputs (NaN, +-inf) either raise a ValueError naming the layer ("raise", the default)
or are replaced ("clamp": NaN -> 0, +-inf -> the dtype's largest magnitude, which the quantizer
then clamps to its clip). A scale must be a finite number in [MIN_SCALE, MAX_SCALE]: a NaN,
infinite, zero or denormal-tiny scale is an error that names the layer and the numbers.
"""

from __future__ import annotations

import math

import torch

NONFINITE_MODES = ("raise", "clamp")
#: smallest / largest scale a quantizer may use (real units per integer step); products of two
#: such scales stay normal float64 numbers
MIN_SCALE = 2.0**-100
MAX_SCALE = 2.0**100


def check_nonfinite_mode(mode: object) -> str:
    if not isinstance(mode, str) or mode not in NONFINITE_MODES:
        raise ValueError(f"nonfinite must be one of {', '.join(NONFINITE_MODES)}, got {mode!r}")
    return mode


def _label(layer: str) -> str:
    return f"layer {layer}" if layer else "quantizer"


def count_nonfinite(x: torch.Tensor) -> int:
    """Number of NaN / inf elements (0 for integer tensors)."""
    if not x.dtype.is_floating_point or x.numel() == 0:
        return 0
    return int((~torch.isfinite(x)).sum())


def guard_input(x: torch.Tensor, layer: str, mode: str, what: str = "input") -> torch.Tensor:
    """`x` unchanged when finite; else ValueError ("raise") or NaN -> 0, +-inf -> +-max
    ("clamp")."""
    bad = count_nonfinite(x)
    if not bad:
        return x
    if mode == "raise":
        raise ValueError(
            f"{_label(layer)}: {what} holds {bad} non-finite value{'s' * (bad != 1)} (NaN or "
            f"inf) of {x.numel()}; pass nonfinite='clamp' to lowbit.quantize to read NaN as 0 "
            "and +-inf as the clip")
    big = torch.finfo(x.dtype).max
    return torch.nan_to_num(x, nan=0.0, posinf=big, neginf=-big)


def check_weights(w: torch.Tensor, layer: str) -> None:
    """Weights are never clamped: a NaN / inf weight means training diverged."""
    bad = count_nonfinite(w)
    if bad:
        raise ValueError(f"{_label(layer)}: weights hold {bad} non-finite value"
                         f"{'s' * (bad != 1)} (NaN or inf) of {w.numel()}: training diverged "
                         "or the weights were loaded wrongly")


def check_scale(value: float, layer: str, what: str = "activation") -> float:
    """`value` when it is a usable scale, else ValueError with the number."""
    if not math.isfinite(value) or not MIN_SCALE <= value <= MAX_SCALE:
        raise ValueError(f"{_label(layer)}: {what} scale is {value:.4g}, outside "
                         f"[{MIN_SCALE:.3g}, {MAX_SCALE:.3g}] (a NaN, infinite or vanishing "
                         "range cannot be quantized)")
    return value
