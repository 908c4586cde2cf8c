"""Core value types shared by every stage: precisions, layouts, epilogues, workloads and
config spaces."""

from .epilogue import OUT_FP16, OUT_INT16, OUT_INT32, Epilogue
from .layout import PACKABLE_BITS, Layout
from .packed import PackedTensor
from .precision import Encoding, Precision, WidePrecision, parse_wa
from .space import Config, ConfigSpace, Knob
from .workload import ConvWorkload, GemmWorkload, Workload, workload_from_dict, workload_from_json
from .workloads import load_workloads

__all__ = [
    "OUT_FP16",
    "OUT_INT16",
    "OUT_INT32",
    "PACKABLE_BITS",
    "Config",
    "ConfigSpace",
    "ConvWorkload",
    "Encoding",
    "Epilogue",
    "GemmWorkload",
    "Knob",
    "Layout",
    "PackedTensor",
    "Precision",
    "WidePrecision",
    "Workload",
    "load_workloads",
    "parse_wa",
    "workload_from_dict",
    "workload_from_json",
]
