"""`save(model, path)` / `load(path)`: one safetensors file holding the tensors, with the JSON
manifest in its header metadata (key "lowbit").

The manifest: {"format": "lowbit", "version": 1, "kind", "arch" (see arch.py, or null),
"lowbit", "torch" (versions), "summary" (one row per layer, lowbit.summary), ...} plus what the
kind writes (registry.py). Loading in a fresh process gives bit-identical outputs: every
quantity that affects them is a tensor in the file or a manifest entry.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..quant.overview import layer_rows
from . import (
    builtin,  # noqa: F401  (registers the built-in kinds)
    compiled,  # noqa: F401  (registered after them, so tried first)
)
from .arch import arch_entry, build_model
from .registry import get_kind, kind_of

FORMAT, VERSION, META_KEY = "lowbit", 1, "lowbit"


def save(model: nn.Module, path: str | os.PathLike, *, arch: str | None = None,
         arch_kwargs: dict | None = None) -> Path:
    """Write a fake-quant, converted (or registered-kind) model to `path`; returns the path.

    arch: how `load` rebuilds the float architecture without being given it
    ("package.module:function", "file.py:function", or a built-in model name; default: the
    model's own `lowbit_arch`, else none and `load` needs model=). arch_kwargs: the factory's
    keyword arguments (JSON values)."""
    from safetensors.torch import save_file

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    kind = kind_of(model)
    if kind is None:
        raise ValueError(f"{type(model).__name__} has no lowbit layers: save a model from "
                         "lowbit.quantize, lowbit.calibrate or lowbit.convert (a float model "
                         "saves with torch.save(model.state_dict(), path))")
    entry = arch_entry(arch, arch_kwargs) if arch is not None else \
        getattr(model, "lowbit_arch", None)
    part, tensors = kind.to_manifest(model)
    manifest = {"format": FORMAT, "version": VERSION, "kind": kind.name, "arch": entry,
                "lowbit": _version(), "torch": torch.__version__,
                "summary": [r.to_dict() for r in layer_rows(model)], **part}
    path = Path(path)
    save_file(tensors, str(path), metadata={META_KEY: json.dumps(manifest)})
    return path


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a saved model, without loading its tensors."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as e:
        raise ValueError(f"{path} is not a lowbit model file (not safetensors: {e})") from None
    if META_KEY not in meta:
        raise ValueError(f"{path} is not a lowbit model file (a safetensors file without a "
                         "lowbit manifest)")
    manifest = json.loads(meta[META_KEY])
    if manifest.get("format") != FORMAT or manifest.get("version", 0) > VERSION:
        raise ValueError(f"{path}: manifest format {manifest.get('format')!r} version "
                         f"{manifest.get('version')!r} is not one this lowbit reads "
                         f"({FORMAT} <= {VERSION})")
    return manifest


def load(path: str | os.PathLike,
         model: nn.Module | Callable[[], nn.Module] | None = None, *,
         device: str | torch.device = "cpu") -> nn.Module:
    """The model saved at `path`, on `device`.

    model: a fresh float model of the saved architecture (it is modified in place and
    returned), or a zero-argument function returning one; default: the architecture the
    manifest names (arch.py); ValueError if neither is available."""
    from safetensors.torch import load_file

    manifest = read_manifest(path)
    kind = get_kind(manifest["kind"])
    if model is not None and not isinstance(model, nn.Module):
        if not callable(model):
            raise TypeError("model must be a torch.nn.Module or a function returning one, "
                            f"got {type(model).__name__}")
        model = model()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model() returned {type(model).__name__}, not a torch.nn.Module")
    base = model if model is not None else (
        build_model(manifest["arch"]) if manifest.get("arch") else None)
    tensors = load_file(str(path))
    return kind.from_manifest(manifest, tensors, base).to(device)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("lowbit")
    except Exception:
        return "unknown"
