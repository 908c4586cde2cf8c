"""Performance models: predict a (template, config, workload) time on a GPU without running it.

  analytic.py   APNN-TC's TLP / compute intensity (`analyze`) and the analytic time model
                (`estimate`: overhead + max(compute, DRAM, L2) + latency over waves)
  geometry.py   the launch geometry each template reports (`KernelTemplate.geometry`)
  occupancy.py, launch.py, roofline.py   resources and roofline floors on a GPU (its
                facts: `lowbit.core.hardware.GpuSpec`)
  dataset.py    every verified measurement (results files, tuning records) as rows
  features.py, learned.py   the learned model (XGBoost on log time over the analytic one)
  fit.py        analytic constants fitted to data; the cuDNN / cuBLAS fp16 estimate
  sampling.py   the thesis's sampling model (time linear in waves, 2x / 3x saturation)
  prune.py      the thesis's filters (launch, fit, coalescing, concurrency)
  evaluate.py   leave-one-layer-out accuracy (median APE, Kendall tau)
  predict.py    `predict_us` / `predict_many` with the default trained model
"""

from ..core.hardware import H100, H200, GpuSpec, current_gpu_spec, gpu_spec_for
from ..kernels.geometry import Geometry, LaunchShape
from .analytic import Analysis, AnalyticParams, Estimate, analyze, estimate
from .dataset import Measurement, deduplicate, load_records, load_results
from .fit import fp16_estimate_us
from .geometry import geometry
from .launch import launch_shape
from .learned import LearnedModel
from .occupancy import Occupancy, occupancy
from .predict import default_model, predict_many, predict_results, predict_us
from .prune import prune_reason, pruned_space, space_filters
from .sampling import WaveLine, sampling_predict, saturation_workloads

__all__ = [
    "H100", "H200", "Analysis", "AnalyticParams", "Estimate", "Geometry",
    "GpuSpec", "LaunchShape", "LearnedModel", "Measurement", "Occupancy", "WaveLine", "analyze",
    "current_gpu_spec", "deduplicate", "default_model", "estimate", "fp16_estimate_us",
    "geometry", "gpu_spec_for", "launch_shape", "load_records", "load_results", "occupancy",
    "predict_many", "predict_results", "predict_us", "prune_reason", "pruned_space",
    "sampling_predict", "saturation_workloads", "space_filters",
]
