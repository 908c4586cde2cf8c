"""Model kinds that `lowbit.save` / `lowbit.load` know: how to detect one, write it and read
it back.

A kind is `ModelKind(name, detect, to_manifest, from_manifest, declared_precisions)`:
    detect(model) -> bool                       is `model` of this kind?
    to_manifest(model) -> (dict, {key: tensor}) JSON-able manifest part and the tensors
    from_manifest(manifest, tensors, base) -> model
    declared_precisions(manifest) -> {key: "s2", ...}  (optional) the integer tensors whose
                                                values the manifest declares a precision of;
                                                `load` checks them against its range
`base` is the float model the saved one was made from (rebuilt from the manifest's `arch`, or
the one the caller passed to `load`), or None when neither is available; a kind that needs it
raises a ValueError saying `pass model=`. Kinds registered later are tried first, so a more
specific kind (e.g. a compiled network plan, registered by the engine) wins over the built-in
fake-quant and converted kinds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ModelKind:
    name: str
    detect: Callable[[nn.Module], bool]
    to_manifest: Callable[[nn.Module], tuple[dict, Tensors]]
    from_manifest: Callable[[dict, Tensors, nn.Module | None], nn.Module]
    declared_precisions: Callable[[dict], dict[str, str]] | None = None


_KINDS: dict[str, ModelKind] = {}


def register_kind(kind: ModelKind) -> ModelKind:
    """Add a model kind (ValueError if its name is taken)."""
    if not isinstance(kind, ModelKind):
        raise TypeError(f"kind must be a ModelKind, got {type(kind).__name__}")
    if kind.name in _KINDS:
        raise ValueError(f"model kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    _KINDS.pop(name, None)


def kind_of(model: nn.Module) -> ModelKind | None:
    """The most recently registered kind that detects `model`."""
    for kind in reversed(_KINDS.values()):
        if kind.detect(model):
            return kind
    return None


def get_kind(name: str) -> ModelKind:
    if name not in _KINDS:
        raise ValueError(f"the file holds a model of kind {name!r}, which this lowbit does not "
                         f"know (known: {', '.join(_KINDS)}); import the package that "
                         "registers it first")
    return _KINDS[name]
