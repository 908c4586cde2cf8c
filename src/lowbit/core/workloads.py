"""The benchmark layers shipped with lowbit (a copy of shared/workloads/*.json), and workload
files: a JSON list of layers, each an object with "op" ("conv2d" or "gemm"), its shape fields
(conv2d: N, H, W, C, K, R, S, optional stride and pad; gemm: M, N, K) and optionally "name",
"source", precisions "w" / "a", layouts and "epilogue". Files are validated: a missing or
unknown field is an error naming the file, the entry and the field (never a default)."""

from __future__ import annotations

import json
from dataclasses import fields
from importlib import resources
from pathlib import Path

from .workload import ConvWorkload, GemmWorkload, Workload, workload_from_dict

SUITES = ("resnet50_3x3_b16", "resnet50_3x3_b256", "tvm_tutorial", "resnet18_b8",
          "resnet50_1x1", "apconv_sweep", "gemm")
_CLASSES = {"conv2d": ConvWorkload, "gemm": GemmWorkload}
_REQUIRED = {"conv2d": ("N", "H", "W", "C", "K", "R", "S"), "gemm": ("M", "N", "K")}
_NOTES = ("name", "source", "notes", "op")


def load_workloads(suite: str, **overrides: object) -> list[tuple[str, Workload]]:
    """(name, workload) pairs of one suite; `overrides` set precisions, layouts, epilogue."""
    if suite not in SUITES:
        raise ValueError(f"suite must be one of {', '.join(SUITES)}, got {suite!r}")
    text = resources.files("lowbit.data.workloads").joinpath(f"{suite}.json").read_text()
    return [(d["name"], workload_from_dict(d, **overrides)) for d in json.loads(text)]


def check_workload_dict(d: object, where: str = "workload") -> None:
    """ValueError naming `where` and the field when `d` is not a complete workload object."""
    if not isinstance(d, dict):
        raise ValueError(f"{where} must be a JSON object with 'op' and shape fields, got "
                         f"{json.dumps(d)[:60]}")
    op = d.get("op")
    if op not in _CLASSES:
        raise ValueError(f"{where}: op must be one of {', '.join(_CLASSES)}, got {op!r}")
    need = _REQUIRED[op]
    missing = [f for f in need if f not in d]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)} ({op} needs "
                         f"{', '.join(need)})")
    known = {f.name for f in fields(_CLASSES[op])} | set(_NOTES)
    unknown = [k for k in d if k not in known]
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r} ({op} fields: "
                         f"{', '.join(sorted(known - set(_NOTES)))})")


def workloads_from_file(path: str | Path, **overrides: object) -> list[tuple[str, Workload]]:
    """(name, workload) pairs of a workload file (module doc); unnamed entries are 'layerI'.
    ValueError naming the file, the entry and the field for anything missing or wrong."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no workload file {path}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    entries = data if isinstance(data, list) else [data]
    if not entries:
        raise ValueError(f"{path} holds no layers")
    out = []
    for i, d in enumerate(entries):
        named = isinstance(d, dict) and "name" in d
        where = f"{path}: entry {i}" + (f" ({d['name']!r})" if named else "")
        check_workload_dict(d, where)
        try:
            wl = workload_from_dict(d, **overrides)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
        out.append((str(d["name"]) if named else f"layer{i}", wl))
    return out
