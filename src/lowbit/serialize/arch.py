"""Which float model a saved model was made from, and how to build it again.

An architecture spec is one string:
    "package.module:function"   an importable factory (called with the saved kwargs)
    "path/to/file.py:function"  a factory in a Python file (stored as an absolute path)
    "name"                      a built-in model: `lowbit.models.get(name, **kwargs)`
A model may name its own architecture with the attribute `lowbit_arch = {"zoo": name,
"kwargs": {...}}` (the built-in model zoo sets it), which `save` uses when no spec is given.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from torch import nn

ZOO_HINT = ("a factory as 'package.module:function' or 'file.py:function'")


def _zoo():
    try:
        return importlib.import_module("lowbit.models")
    except ImportError:
        return None


def arch_entry(spec: str | None, kwargs: dict | None = None) -> dict | None:
    """Manifest entry for an architecture spec: {"factory": ..., "kwargs": ...} or
    {"zoo": name, "kwargs": ...}; ValueError for a spec that cannot name a model."""
    if spec is None:
        return None
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"arch must be a string naming the model, got {spec!r}")
    kwargs = dict(kwargs or {})
    target, sep, fn = spec.rpartition(":")
    if sep:
        if not target or not fn.isidentifier():
            raise ValueError(f"arch {spec!r} must be {ZOO_HINT}")
        if target.endswith(".py"):
            path = Path(target).expanduser().resolve()
            if not path.is_file():
                raise FileNotFoundError(f"arch {spec!r}: no file {path}")
            target = str(path)
        return {"factory": f"{target}:{fn}", "kwargs": kwargs}
    zoo = _zoo()
    if zoo is None:
        raise ValueError(f"arch {spec!r} is not {ZOO_HINT}, and this lowbit has no built-in "
                         "model zoo (lowbit.models)")
    if spec not in zoo.names():
        raise ValueError(f"arch {spec!r} is neither a built-in model ({', '.join(zoo.names())})"
                         f" nor {ZOO_HINT}")
    return {"zoo": spec, "kwargs": kwargs}


def _factory(spec: str):
    target, _, fn = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise FileNotFoundError(f"model file {path} does not exist")
        mod_spec = importlib.util.spec_from_file_location(f"lowbit_user_{path.stem}", path)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ValueError(f"cannot import {target!r} for model {spec!r}: {e}") from None
    factory = getattr(module, fn, None)
    if not callable(factory):
        raise ValueError(f"{target} has no function {fn!r} (model {spec!r})")
    return factory


def build_model(entry: dict) -> nn.Module:
    """The float model an arch entry names, freshly built."""
    kwargs = entry.get("kwargs", {})
    if "factory" in entry:
        model = _factory(entry["factory"])(**kwargs)
        where = entry["factory"]
    else:
        zoo = _zoo()
        if zoo is None:
            raise ValueError(f"the model names the built-in model {entry['zoo']!r}, but this "
                             "lowbit has no model zoo (lowbit.models): pass model=")
        model = zoo.get(entry["zoo"], **kwargs)
        where = entry["zoo"]
    if not isinstance(model, nn.Module):
        raise TypeError(f"{where} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def model_from_spec(spec: str, **kwargs: object) -> tuple[nn.Module, dict]:
    """(float model, arch entry) for a spec string (the CLI's MODEL argument)."""
    entry = arch_entry(spec, kwargs)
    return build_model(entry), entry
