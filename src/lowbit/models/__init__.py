"""Model zoo: the networks `lowbit bench` and the whole-network tests run, defined here with
torchvision's architectures and module names (torchvision is not needed; its state dicts load).

    model = lowbit.models.get("resnet18", num_classes=1000, weights=None)   # random weights
    model = lowbit.models.get("vgg16", weights="vgg16.pth")                 # a saved state dict

Options per model (keyword arguments of `get`): `width` (every channel count scaled, for
small test models; default 1.0) and, for apnn_vgg_variant, `image_size` (its first FC's width
follows it; default 32).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import nn

from .alexnet import alexnet
from .digits import digits_cnn, digits_resnet
from .resnet import resnet18, resnet34, resnet50
from .vgg import apnn_vgg_variant, vgg16

_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "resnet18": resnet18, "resnet34": resnet34, "resnet50": resnet50, "vgg16": vgg16,
    "alexnet": alexnet, "apnn_vgg_variant": apnn_vgg_variant,
    "digits_cnn": digits_cnn, "digits_resnet": digits_resnet,
}

#: the whole-network benchmark networks (`lowbit bench NAME`)
NETWORKS = ("resnet18", "resnet34", "resnet50", "vgg16", "alexnet", "apnn_vgg_variant")


def names() -> list[str]:
    """Every model `get` builds: the benchmark networks, then the small digits models."""
    return list(_BUILDERS)


def _state_dict(weights: object) -> Mapping[str, torch.Tensor]:
    if isinstance(weights, Mapping):
        return weights
    if isinstance(weights, (str, Path)):
        path = Path(weights)
        if not path.is_file():
            raise ValueError(f"weights file {str(path)!r} does not exist")
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, Mapping):
            raise ValueError(f"weights file {str(path)!r} holds no state dict")
        return state
    raise TypeError("weights must be None, a state dict or the path of a saved state dict, "
                    f"got {type(weights).__name__}")


def get(name: str, num_classes: int = 1000, weights: object = None,
        **options: object) -> nn.Module:
    """A new model `name` (see `names()`) with `num_classes` outputs; random initialization
    (torchvision's scheme) unless `weights` (a state dict or a file: .safetensors or
    torch.save'd) is given, which must match the architecture exactly."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(names())}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
    width = options.get("width", 1.0)
    if isinstance(width, bool) or not isinstance(width, (int, float)) or not width > 0:
        raise ValueError(f"width must be a number > 0, got {width!r}")
    try:
        model = _BUILDERS[name](num_classes=num_classes, **options)
    except TypeError as e:
        raise TypeError(f"model {name!r}: {e}") from None
    if weights is not None:
        missing, unexpected = [], []
        state = _state_dict(weights)
        try:
            result = model.load_state_dict(state, strict=False)
            missing, unexpected = result.missing_keys, result.unexpected_keys
        except RuntimeError as e:
            raise ValueError(f"weights do not fit {name}: {e}") from None
        if missing or unexpected:
            raise ValueError(f"weights do not fit {name}: missing {missing[:5]}, unexpected "
                             f"{unexpected[:5]}")
    # names the architecture, so lowbit.save can rebuild it without arch= (serialize.arch)
    model.lowbit_arch = {"zoo": name, "kwargs": {"num_classes": num_classes, **options}}
    return model


__all__ = ["NETWORKS", "get", "names"]
