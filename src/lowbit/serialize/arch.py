"""Which float model a saved model was made from, and how to build it again.

An architecture spec is one string:
    "package.module:function"   an importable factory (called with the saved kwargs)
    "path/to/file.py:function"  a factory in a Python file (`save` stores its path relative
                                to the model file's folder; `load` resolves it from there)
    "name"                      a built-in model: `lowbit.models.get(name, **kwargs)`
A model may name its own architecture with the attribute `lowbit_arch = {"zoo": name,
"kwargs": {...}}` (the built-in model zoo sets it), which `save` uses when no spec is given.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

from torch import nn

ZOO_HINT = ("a factory as 'package.module:function' or 'file.py:function'")


def _zoo():
    try:
        return importlib.import_module("lowbit.models")
    except ImportError:
        return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


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
        elif not _importable(target):
            raise ValueError(f"arch {spec!r}: no module {target!r} can be imported here "
                             f"(arch must be {ZOO_HINT})")
        return {"factory": f"{target}:{fn}", "kwargs": kwargs}
    zoo = _zoo()
    if zoo is None:
        raise ValueError(f"arch {spec!r} is not {ZOO_HINT}, and this lowbit has no built-in "
                         "model zoo (lowbit.models)")
    if spec not in zoo.names():
        raise ValueError(f"arch {spec!r} is neither a built-in model ({', '.join(zoo.names())})"
                         f" nor {ZOO_HINT}")
    return {"zoo": spec, "kwargs": kwargs}


PASS_MODEL = ("pass model= (a fresh float model of the saved architecture, or a function "
              "returning one)")


def relative_entry(entry: dict | None, folder: Path) -> dict | None:
    """`entry` with a 'file.py:function' factory's path made relative to `folder` (the model
    file's), so that the two move together; other entries unchanged."""
    if not entry or "factory" not in entry:
        return entry
    target, _, fn = entry["factory"].rpartition(":")
    if not target.endswith(".py"):
        return entry
    try:
        rel = os.path.relpath(Path(target).resolve(), Path(folder).resolve())
    except ValueError:  # another drive: keep the absolute path
        return entry
    return {**entry, "factory": f"{Path(rel).as_posix()}:{fn}"}


def _factory(spec: str, base_dir: Path | None):
    target, _, fn = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(base_dir or ".") / target
        if not path.is_file():
            raise FileNotFoundError(f"the model's architecture {spec!r} is missing: no file "
                                    f"{path.resolve()}; {PASS_MODEL}")
        mod_spec = importlib.util.spec_from_file_location(f"lowbit_user_{path.stem}", path)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise ValueError(f"cannot import {target!r} for model {spec!r}: {e}; "
                             f"{PASS_MODEL}") from None
    factory = getattr(module, fn, None)
    if not callable(factory):
        raise ValueError(f"{target} has no function {fn!r} (model {spec!r}); {PASS_MODEL}")
    return factory


def build_model(entry: dict, base_dir: str | os.PathLike | None = None) -> nn.Module:
    """The float model an arch entry names, freshly built; a relative 'file.py:function'
    path is resolved from `base_dir` (the model file's folder)."""
    if not isinstance(entry, dict) or not ("factory" in entry or "zoo" in entry):
        raise ValueError(f"the architecture entry {entry!r} names no model; {PASS_MODEL}")
    kwargs = entry.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise ValueError(f"the architecture entry's kwargs must be a JSON object, got "
                         f"{kwargs!r}")
    if "factory" in entry:
        model = _factory(entry["factory"], Path(base_dir) if base_dir else None)(**kwargs)
        where = entry["factory"]
    else:
        zoo = _zoo()
        if zoo is None:
            raise ValueError(f"the model names the built-in model {entry['zoo']!r}, but this "
                             f"lowbit has no model zoo (lowbit.models): {PASS_MODEL}")
        model = zoo.get(entry["zoo"], **kwargs)
        where = entry["zoo"]
    if not isinstance(model, nn.Module):
        raise TypeError(f"{where} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def model_from_spec(spec: str, **kwargs: object) -> tuple[nn.Module, dict]:
    """(float model, arch entry) for a spec string (the CLI's MODEL argument)."""
    entry = arch_entry(spec, kwargs)
    return build_model(entry), entry
