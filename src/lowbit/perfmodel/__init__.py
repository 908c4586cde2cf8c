"""Analytic performance model: launch shapes, occupancy, TLP / compute intensity, pruning.

Used by the tuner for cost-model features and to prune launch shapes before measuring
(Dao's thesis: drop shapes the workload, coalescing or occupancy rule out). `roofline.py`
(measured peaks, `floor_us`) lives here too.
"""

from .analytic import Analysis, analyze
from .hardware import H100, GpuSpec, current_gpu_spec
from .launch import LaunchShape, launch_shape
from .occupancy import Occupancy, occupancy
from .prune import prune_reason, pruned_space

__all__ = [
    "H100", "Analysis", "GpuSpec", "LaunchShape", "Occupancy", "analyze", "current_gpu_spec",
    "launch_shape", "occupancy", "prune_reason", "pruned_space",
]
