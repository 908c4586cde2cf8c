"""The benchmark layers shipped with lowbit (a copy of shared/workloads/*.json)."""

from __future__ import annotations

import json
from importlib import resources

from .workload import Workload, workload_from_dict

SUITES = ("resnet50_3x3_b16", "resnet50_3x3_b256", "tvm_tutorial", "resnet18_b8",
          "resnet50_1x1", "apconv_sweep", "gemm")


def load_workloads(suite: str, **overrides: object) -> list[tuple[str, Workload]]:
    """(name, workload) pairs of one suite; `overrides` set precisions, layouts, epilogue."""
    if suite not in SUITES:
        raise ValueError(f"suite must be one of {', '.join(SUITES)}, got {suite!r}")
    text = resources.files("lowbit.data.workloads").joinpath(f"{suite}.json").read_text()
    return [(d["name"], workload_from_dict(d, **overrides)) for d in json.loads(text)]
