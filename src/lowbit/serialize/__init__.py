"""Save and load lowbit models: `save(model, path)` / `load(path)` (one safetensors file with a
JSON manifest), for fake-quant, converted and compiled models (`compiled.py`: a network's plans)
and any kind registered with `register_kind`."""

from .arch import arch_entry, build_model, model_from_spec
from .files import load, read_manifest, save, verify
from .registry import ModelKind, get_kind, kind_of, register_kind, unregister_kind

__all__ = ["ModelKind", "arch_entry", "build_model", "get_kind", "kind_of", "load",
           "model_from_spec", "read_manifest", "register_kind", "save", "unregister_kind",
           "verify"]
