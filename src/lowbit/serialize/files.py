"""`save(model, path)` / `load(path)`: one safetensors file holding the tensors, with the JSON
manifest in its header metadata (key "lowbit") and the manifest's sha256 beside it
(integrity.py).

The manifest: {"format": "lowbit", "version": 2, "kind", "arch" (see arch.py, or null),
"lowbit", "torch" (versions), "summary" (one row per layer, lowbit.summary), "tensors" (the
sha256 of every stored tensor), ...} plus what the kind writes (registry.py). Loading checks
every digest and every integer weight against its declared precision, and gives bit-identical
outputs in a fresh process: every quantity that affects them is a tensor in the file or a
manifest entry. Version-1 files (no digests) still load, with the precision checks only.
"""

from __future__ import annotations

import inspect
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
from .arch import arch_entry, build_model, relative_entry
from .integrity import (
    MANIFEST_DIGEST_KEY,
    check_manifest_digest,
    check_ranges,
    check_tensors,
    tensor_digests,
    text_digest,
)
from .registry import Tensors, get_kind, kind_of

FORMAT, VERSION, META_KEY = "lowbit", 2, "lowbit"
DIGESTS_SINCE = 2  # the first version whose files carry digests


def _path_arg(path: object, name: str = "path") -> Path:
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes):
        raise TypeError(f"{name} must be a file path (str or os.PathLike), got "
                        f"{type(path).__name__}")
    p = Path(path)
    if not str(path):
        raise ValueError(f"{name} must name a file, got an empty string")
    return p


def _save_path(path: object) -> Path:
    p = _path_arg(path)
    if p.is_dir():
        raise ValueError(f"path {str(p)!r} is a directory: give a file name inside it, e.g. "
                         f"{str(p / 'model.safetensors')!r}")
    folder = p.parent
    if not folder.is_dir():
        raise FileNotFoundError(f"path {str(p)!r}: the folder {str(folder)!r} does not exist "
                                "(create it first)")
    return p


def save(model: nn.Module, path: str | os.PathLike, *, arch: str | None = None,
         arch_kwargs: dict | None = None) -> Path:
    """Write a fake-quant, converted, compiled (or registered-kind) model to `path`; returns
    the path.

    arch: how `load` rebuilds the float architecture without being given it
    ("package.module:function", "file.py:function" (stored relative to `path`'s folder), or a
    built-in model name; default: the model's own `lowbit_arch`, else none and `load` needs
    model=). arch_kwargs: the factory's keyword arguments (JSON values)."""
    from safetensors.torch import save_file

    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    path = _save_path(path)
    kind = kind_of(model)
    if kind is None:
        raise ValueError(f"{type(model).__name__} has no lowbit layers: save a model from "
                         "lowbit.quantize, lowbit.calibrate or lowbit.convert (a float model "
                         "saves with torch.save(model.state_dict(), path))")
    if arch_kwargs is not None and not isinstance(arch_kwargs, dict):
        raise TypeError(f"arch_kwargs must be a dict of JSON values, got "
                        f"{type(arch_kwargs).__name__}")
    entry = arch_entry(arch, arch_kwargs) if arch is not None else \
        getattr(model, "lowbit_arch", None)
    part, tensors = kind.to_manifest(model)
    manifest = {"format": FORMAT, "version": VERSION, "kind": kind.name,
                "arch": relative_entry(entry, path.parent),
                "lowbit": _version(), "torch": torch.__version__,
                "summary": [r.to_dict() for r in layer_rows(model)], **part,
                "tensors": tensor_digests(tensors)}
    try:
        text = json.dumps(manifest)
    except TypeError as e:
        raise ValueError(f"arch_kwargs must hold JSON values only ({e})") from None
    save_file(tensors, str(path), metadata={META_KEY: text, MANIFEST_DIGEST_KEY:
                                            text_digest(text)})
    return path


def read_manifest(path: str | os.PathLike) -> dict:
    """The manifest of a saved model (checked against its digest), without loading its
    tensors."""
    from safetensors import safe_open

    path = _path_arg(path)
    if path.is_dir():
        raise ValueError(f"path {str(path)!r} is a directory, not a saved lowbit model file")
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
    text = meta[META_KEY]
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: the lowbit manifest is not valid JSON ({e}): the file is "
                         "damaged") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: the lowbit manifest is not a JSON object: the file is "
                         "damaged")
    version = manifest.get("version", 0)
    if manifest.get("format") != FORMAT or not isinstance(version, int) or version > VERSION:
        raise ValueError(f"{path}: manifest format {manifest.get('format')!r} version "
                         f"{version!r} is not one this lowbit reads ({FORMAT} <= {VERSION})")
    check_manifest_digest(path, text, meta.get(MANIFEST_DIGEST_KEY),
                          required=version >= DIGESTS_SINCE)
    if not isinstance(manifest.get("kind"), str):
        raise ValueError(f"{path}: the manifest names no model kind: the file is damaged")
    return manifest


def verify(path: str | os.PathLike) -> tuple[dict, Tensors]:
    """(manifest, tensors) of a saved model after every check: the manifest's and each
    tensor's sha256, and each integer weight against its declared precision. ValueError
    naming the file and the tensor for anything damaged."""
    from safetensors.torch import load_file

    manifest = read_manifest(path)
    path = Path(path)
    kind = get_kind(manifest["kind"])
    try:
        tensors = load_file(str(path))
    except Exception as e:
        raise ValueError(f"{path}: its tensors cannot be read ({e}): the file is "
                         "damaged") from None
    if manifest.get("version", 0) >= DIGESTS_SINCE:
        check_tensors(path, manifest, tensors)
    if kind.declared_precisions is not None:
        try:
            declared = kind.declared_precisions(manifest)
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path}: the manifest's layer list is incomplete ({e!r}): the "
                             "file is damaged") from None
        check_ranges(path, tensors, declared)
    return manifest, tensors


def load(path: str | os.PathLike,
         model: nn.Module | Callable[[], nn.Module] | None = None, *,
         device: str | torch.device = "cpu") -> nn.Module:
    """The model saved at `path`, on `device`, after `verify`'s checks.

    model: a fresh float model of the saved architecture (it is modified in place and
    returned), or a zero-argument function returning one; default: the architecture the
    manifest names (arch.py); ValueError if neither is available."""
    path = _path_arg(path)
    if model is not None and not isinstance(model, nn.Module) and not callable(model):
        raise TypeError("model must be a torch.nn.Module or a function returning one, "
                        f"got {type(model).__name__}")
    device = _device_arg(device)
    manifest, tensors = verify(path)
    kind = get_kind(manifest["kind"])
    if model is not None and not isinstance(model, nn.Module):
        try:
            inspect.signature(model).bind()
        except TypeError:
            raise TypeError("model must be a torch.nn.Module or a function of no arguments "
                            f"returning one; {model!r} takes arguments") from None
        except ValueError:  # no signature to inspect (a builtin): call it and see
            pass
        model = model()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model() returned {type(model).__name__}, not a torch.nn.Module")
    base = model if model is not None else (
        build_model(manifest["arch"], path.parent) if manifest.get("arch") else None)
    return kind.from_manifest(manifest, tensors, base).to(device)


def _device_arg(device: object) -> torch.device:
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device must name a torch device ('cpu', 'cuda', 'cuda:1'), got "
                         f"{device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no CUDA GPU is visible here (use 'cpu')")
    return dev


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("lowbit")
    except Exception:
        return "unknown"
