"""Models from outside the zoo for `lowbit bench`: a torchvision classifier by name
(`tv:mobilenet_v2`) or a function of a Python file (`path/to/file.py:build`).

`torchvision_models()` imports `torchvision.models` also where torchvision's compiled ops
cannot load beside the installed torch (a CUDA wheel of torchvision next to a CPU torch: its
import then fails with "operator torchvision::nms does not exist"): the model definitions are
pure Python, and only the schemas of the two ops that torchvision's import registers fake
kernels for are missing, so stand-in schemas are defined for them first (the ops themselves
are never called by a classification model).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

#: ops whose fake (meta) kernels torchvision registers at import, with their schemas
_TORCHVISION_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_standins: list[torch.library.Library] = []  # kept alive: dropping one undefines its ops


def _ops_loaded() -> bool:
    try:
        torch._C._dispatch_has_kernel_for_dispatch_key("torchvision::nms", "CPU")
        return True
    except RuntimeError:
        return False


def torchvision_models() -> ModuleType:
    """`torchvision.models` (module docstring); ImportError when torchvision is not
    installed."""
    if "torchvision.models" in sys.modules:
        return sys.modules["torchvision.models"]
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        raise ImportError("torchvision is not installed (pip install torchvision)")
    if not _ops_loaded():
        library = next(Path(spec.origin).parent.glob("_C*.so"), None)
        try:
            if library is None:
                raise OSError("no compiled extension")
            torch.ops.load_library(str(library))
        except (OSError, RuntimeError):
            lib = torch.library.Library("torchvision", "FRAGMENT")
            for name, schema in _TORCHVISION_SCHEMAS.items():
                if not _has_schema(name):
                    lib.define(schema)
            _standins.append(lib)
    import torchvision.models

    return torchvision.models


def _has_schema(name: str) -> bool:
    try:
        torch._C._dispatch_has_kernel_for_dispatch_key(f"torchvision::{name}", "Meta")
        return True
    except RuntimeError:
        return False


def torchvision_model(name: str, **kwargs: object) -> nn.Module:
    """torchvision's classifier `name` (random weights) built with `kwargs`."""
    models = torchvision_models()
    try:
        builder = models.get_model_builder(name)
    except ValueError:
        raise ValueError(f"torchvision has no model {name!r}; classification models: "
                         f"{', '.join(models.list_models(module=models))}") from None
    return builder(weights=None, **kwargs)


def file_model(spec: str, **kwargs: object) -> nn.Module:
    """The module that the function `fn` of the Python file `path` returns, for a spec
    'path.py:fn' (called with the keyword arguments it accepts of `kwargs`)."""
    path, sep, fn = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not fn.isidentifier():
        raise ValueError(f"a model file must be given as 'path.py:function', got {spec!r}")
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"model file {path!r} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"_lowbit_model_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    build = getattr(module, fn, None)
    if not callable(build):
        raise ValueError(f"{path} has no function {fn!r}")
    params = inspect.signature(build).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    model = build(**{k: v for k, v in kwargs.items() if takes_any or k in params})
    if not isinstance(model, nn.Module):
        raise TypeError(f"{spec} must return a torch.nn.Module, got {type(model).__name__}")
    return model


def is_external(name: str) -> bool:
    """Whether a bench model name is a torchvision name or a file function (not the zoo)."""
    return name.startswith("tv:") or ".py:" in name


def external_model(name: str, num_classes: int = 1000) -> nn.Module:
    """The float model of a 'tv:NAME' or 'path.py:fn' spec (eval mode, random weights)."""
    if name.startswith("tv:"):
        model = torchvision_model(name[3:], num_classes=num_classes)
    elif ".py:" in name:
        model = file_model(name, num_classes=num_classes)
    else:
        raise ValueError(f"a model outside the zoo is 'tv:NAME' or 'path.py:function', got "
                         f"{name!r}")
    return model.eval()
