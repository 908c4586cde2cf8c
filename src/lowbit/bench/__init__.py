"""Whole-network benchmarks (`lowbit bench`, `lowbit tune --model`, benchmarks/network.py): a
calibrated quantized zoo model compiled for the GPU executor, timed against PyTorch fp16 in the
same process. The application layer over `lowbit.runtime`: nothing below it imports it.

- `recipes`: precision recipes ("wXaY", "wXaY-all", "mixed") and the quantized, calibrated
  models they make (`build_quantized`), their plans (`compile_plan`, `impl_chooser`) and
  distinct kernel workloads (`network_workloads`);
- `timing`: CUDA-event step times (launches queued behind a sleep, L2 flushed), host overhead
  per forward, and each step's roofline floor (`step_floor_us`);
- `baselines`: PyTorch fp16 eager, CUDA-graph and torch.compile times of the float model;
- `network`: `bench_network(BenchCase(...))`, one "network" results row;
- `summary`: the rows as a text table and a per-step figure.

The targets a benchmark run is judged by live with the benchmark (benchmarks/network.py).
"""

from .baselines import compile_baseline_ms, fp16_baselines, fp16_model
from .network import BenchCase, bench_network
from .recipes import (
    IMAGE_SIZE,
    MIX_CYCLE,
    build_quantized,
    compile_plan,
    conv_linear_names,
    impl_chooser,
    network_workloads,
    parse_recipe,
    random_images,
    randomize_batchnorms,
    recipe_layers,
)
from .summary import TENSORRT_INT8_RESNET50_IMAGES_S, per_layer_figure, summary_table
from .timing import (
    BANDWIDTH,
    PEAK_OPS,
    cuda_events_us,
    graph_of,
    host_overhead_us,
    median_us,
    step_floor_us,
    step_times_us,
)

__all__ = [
    "BANDWIDTH", "IMAGE_SIZE", "MIX_CYCLE", "PEAK_OPS", "TENSORRT_INT8_RESNET50_IMAGES_S",
    "BenchCase", "bench_network", "build_quantized", "compile_baseline_ms", "compile_plan",
    "conv_linear_names", "cuda_events_us", "fp16_baselines", "fp16_model", "graph_of",
    "host_overhead_us", "impl_chooser", "median_us", "network_workloads", "parse_recipe",
    "per_layer_figure", "random_images", "randomize_batchnorms", "recipe_layers",
    "step_floor_us", "step_times_us", "summary_table",
]
