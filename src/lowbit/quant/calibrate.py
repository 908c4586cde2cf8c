"""Post-training calibration: set every activation range of a quantized model from data."""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch
from torch import nn

from ..core.progress import progress
from .api import quant_layers
from .inputs import InputShapeError, checked_layer_inputs
from .residual import value_quantizers

__all__ = ["InputShapeError", "calibrate"]


def _batch_input(batch: object, index: int) -> torch.Tensor:
    x = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    if not isinstance(x, torch.Tensor):
        raise TypeError("loader must yield tensors or (input, target) tuples/lists of tensors, "
                        f"got {type(x).__name__} in batch {index}")
    if not x.is_floating_point():
        raise TypeError(f"loader must yield float input tensors, got {x.dtype} in batch "
                        f"{index} (shape {tuple(x.shape)})")
    return x


def calibrate(model: nn.Module, loader: Iterable, num_batches: int | None = None) -> nn.Module:
    """Run `model` (eval mode, no grad) over `loader` with every activation observer
    accumulating, then freeze the ranges (the same observer method as chosen in `quantize`).

    loader: yields input tensors or (input, target) pairs, already on the model's device.
    num_batches: stop after this many batches (default: the whole loader). Returns the model,
    calibrated in place; its activation quantizers are `frozen` (QAT will not move them; set
    `act_quant.frozen = False` to let training update them again). Empty batches are allowed;
    a batch holding NaN / inf raises (nonfinite="raise") or is skipped value by value
    ("clamp"). A layer that saw only zeros has no scale: ValueError with the numbers. A layer
    no batch reached stays without a range (a warning; convert refuses it).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    layers = quant_layers(model)
    if not layers:
        raise ValueError("model has no lowbit fake-quant layers: call lowbit.quantize first")
    if not isinstance(loader, Iterable) or isinstance(loader, (torch.Tensor, str, bytes)):
        raise TypeError(f"loader must be an iterable of batches (a DataLoader, or a list of "
                        f"input tensors: [x] for one batch), got {type(loader).__name__}")
    if num_batches is not None and (isinstance(num_batches, bool)
                                    or not isinstance(num_batches, int) or num_batches < 1):
        raise ValueError(f"num_batches must be None or an int >= 1, got {num_batches!r}")
    # the layers' input quantizers, then the residual stream's and the activations' inputs
    # (`lowbit.quant.residual`)
    layers = [(name, layer.act_quant) for name, layer in layers] + list(
        value_quantizers(model).items())
    quantizers = [q for _, q in layers]
    was_training = model.training
    model.eval()
    seen = 0
    try:
        for q in quantizers:
            q.calibrating = True
            q.observer.start_calibration()
            q.mean_abs.zero_()
        with torch.no_grad(), progress("calibrating", total=_total(loader, num_batches)) as bar:
            for batch in loader:
                x = _batch_input(batch, seen)
                with checked_layer_inputs(model, f"loader's batch {seen} (shape "
                                                 f"{tuple(x.shape)})", check_dtype=True):
                    model(x)
                seen += 1
                bar.advance()
                if num_batches is not None and seen >= num_batches:
                    break
    finally:
        for q in quantizers:
            q.calibrating = False
        model.train(was_training)
    if seen == 0:
        raise ValueError("loader yielded no batches")
    zero, unseen = [], []
    for (name, _), q in zip(layers, quantizers, strict=True):
        obs = q.observer
        if obs._calib is None:
            unseen.append(name)
        elif obs._calib[1] == 0.0:
            zero.append(f"layer {name}: all {int(obs.samples)} calibration values were 0 "
                        f"({int(obs.nonfinite)} non-finite skipped)")
    if zero:
        raise ValueError(f"loader ({seen} batches): " + "; ".join(zero) + ": no scale can be "
                         "set from zeros; calibrate on representative data, or keep these "
                         "layers float (skip=[...])")
    if unseen:
        warnings.warn(f"lowbit.calibrate: no calibration batch reached {', '.join(unseen)} "
                      f"(in {seen} batches): they have no range and convert will refuse them",
                      stacklevel=2)
    for q in quantizers:
        q.observer.finish_calibration()
        q.frozen = True
    return model


def _total(loader: Iterable, num_batches: int | None) -> int | None:
    try:
        n = len(loader)  # type: ignore[arg-type]
    except TypeError:
        return num_batches
    return n if num_batches is None else min(n, num_batches)
