"""Timing of device work: median over repeats, warm-up first, L2 flushed between runs.

GPU timing uses Triton's `do_bench` (CUDA events, L2 cleared before every run) or its CUDA-graph
variant (`cuda_graph=True`) where launch overhead would dominate; CPU timing (stand-in
measurers, tests) uses the median of `time.perf_counter` deltas.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def time_us(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 100,
            cuda_graph: bool = False, device: str | torch.device = "cuda") -> float:
    """Median run time of `fn()` in microseconds."""
    if torch.device(device).type != "cuda":
        return _time_cpu_us(fn, warmup_ms, rep_ms)
    import triton.testing

    if cuda_graph:
        with torch.cuda.stream(torch.cuda.Stream()):
            ms = triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")
    else:
        ms = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    return float(ms) * 1e3


def _time_cpu_us(fn: Callable[[], object], warmup_ms: float, rep_ms: float) -> float:
    t_end = time.perf_counter() + warmup_ms / 1e3
    fn()
    while time.perf_counter() < t_end:
        fn()
    samples: list[float] = []
    t_end = time.perf_counter() + rep_ms / 1e3
    while len(samples) < 3 or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6
