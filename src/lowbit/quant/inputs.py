"""Input checks at every conv / linear layer of a model: a batch that does not fit the model
is a ValueError naming the caller's argument, the layer and the shape it takes, raised before
the layer runs (instead of torch's conv error from deep inside the forward)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


class InputShapeError(ValueError):
    """A model input that does not fit a layer: `layer` names it, `problem` says how."""

    def __init__(self, argument: str, layer: str, problem: str) -> None:
        super().__init__(f"{argument} does not fit the model: layer {layer} {problem}")
        self.argument, self.layer, self.problem = argument, layer, problem


def layer_input_channels(layer: nn.Module) -> tuple[str, int] | None:
    """('conv2d' or 'linear', input channels) of a Conv2d / Linear layer, fake-quant or
    integer (lowbit's integer layers: weight KRSC or [K, C]), else None."""
    if isinstance(layer, nn.Conv2d):
        return "conv2d", layer.in_channels
    if isinstance(layer, nn.Linear):
        return "linear", layer.in_features
    kind, weight = getattr(layer, "kind", None), getattr(layer, "weight", None)
    if kind in ("conv2d", "linear") and isinstance(weight, torch.Tensor) and weight.dim() >= 2:
        return kind, int(weight.shape[-1])
    return None


def _spatial_problem(layer: nn.Conv2d, x: torch.Tensor, c: int) -> str | None:
    if layer.padding == "same":
        return None
    pad = layer.padding if isinstance(layer.padding, tuple) else (0, 0)
    need = [d * (k - 1) + 1 - 2 * p
            for d, k, p in zip(layer.dilation, layer.kernel_size, pad, strict=True)]
    if x.shape[-2] < need[0] or x.shape[-1] < need[1]:
        return (f"expects input of shape (N, {c}, H, W) with H >= {need[0]} and W >= "
                f"{need[1]} (its {layer.kernel_size} kernel), got {tuple(x.shape)}")
    return None


def layer_input_problem(layer: nn.Module, x: torch.Tensor) -> str | None:
    """What is wrong with `x` as the input of a conv / linear layer, or None."""
    found = layer_input_channels(layer)
    if found is None:
        return None
    kind, c = found
    if kind == "linear":
        if x.dim() < 1 or x.shape[-1] != c:
            return f"expects input of shape (..., {c}), got {tuple(x.shape)}"
        return None
    if x.dim() != 4 or x.shape[1] != c:  # a batch: BatchNorm2d and the plans need N
        return f"expects input of shape (N, {c}, H, W) ({c} channels), got {tuple(x.shape)}"
    return _spatial_problem(layer, x, c) if isinstance(layer, nn.Conv2d) else None


@contextlib.contextmanager
def checked_layer_inputs(model: nn.Module, argument: str, check_dtype: bool = False
                         ) -> Iterator[None]:
    """Within the block, every conv / linear layer of `model` checks its input before it
    runs: InputShapeError (a ValueError) naming `argument`, the layer and the shape it takes;
    with `check_dtype`, a TypeError for a float input of another dtype than a float layer's
    weight (float64 batches into a float32 model)."""

    def check(name: str):
        def hook(layer: nn.Module, args: tuple) -> None:
            x = args[0] if args else None
            if not isinstance(x, torch.Tensor):
                return
            problem = layer_input_problem(layer, x)
            if problem:
                raise InputShapeError(argument, name, problem)
            weight = getattr(layer, "weight", None)
            if check_dtype and isinstance(weight, torch.Tensor) and \
                    weight.is_floating_point() and x.dtype != weight.dtype:
                raise TypeError(f"{argument} is {x.dtype}, but layer {name} computes in "
                                f"{weight.dtype}: convert the batches (x.to({weight.dtype}))")
        return hook

    handles = [m.register_forward_pre_hook(check(n)) for n, m in model.named_modules()
               if layer_input_channels(m) is not None]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
