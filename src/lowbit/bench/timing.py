"""GPU timing of a compiled network's steps and their roofline floors (`bench_network`).

Step times are CUDA events behind a sleep kernel that queues the launches first, so launch
gaps do not count; a step timed alone has the L2 flushed before each call, as it finds it
inside the forward. Floors (H100, `core.hardware.GpuSpec`): bytes / 3.0 TB/s against ops / peak
per implementation: bit-serial 10,279 T bit-ops/s / (w_bits a_bits), int8 1,280 TOPS, fp16
648 TFLOPS; bytes are the step's ideal traffic (inputs, weights and outputs in their stored
layouts, no int32 round trip).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from ..graph.impl import is_bitserial
from ..graph.ir import Layer, Plan, layer_weight_bytes

#: the floors' DRAM bandwidth (bytes / s) and peak rates per implementation (ops / s)
BANDWIDTH = 3.0e12
PEAK_OPS = {"bitserial": 10_279e12, "int8": 1_280e12, "fp16": 648e12}


def cuda_events_us(fn: Callable[[], object], reps: int = 20, sleep_ms: float = 20.0
                   ) -> list[float]:
    """GPU time of each of `reps` calls of fn (CUDA events), the launches queued behind a
    sleep kernel first so the host's launch time does not show, and twice the L2's bytes
    overwritten before each call (untimed), so that fn reads its operands from DRAM as it does
    inside a network's forward (a layer timed back to back otherwise finds its weights in L2:
    VGG-16's 12.8 MB fc6 at batch 8 took 14.8 us so, 24.7 inside the forward,
    `network-20261128-000418.json`)."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    scratch = torch.empty(2 * getattr(props, "L2_cache_size", 64 << 20), dtype=torch.uint8,
                          device="cuda")
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
             for _ in range(reps)]
    torch.cuda.synchronize()
    torch.cuda._sleep(int(sleep_ms * 1.5e6))
    for start, end in pairs:
        scratch.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e3 for start, end in pairs]


def step_times_us(steps: list[Callable[[], object]], reps: int = 10,
                  sleep_ms: float = 50.0) -> list[float]:
    """Median GPU time of each step inside the whole sequence (events between steps)."""
    samples: list[list[float]] = [[] for _ in steps]
    for _ in range(reps):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(len(steps) + 1)]
        torch.cuda.synchronize()
        torch.cuda._sleep(int(sleep_ms * 1.5e6))
        for i, step in enumerate(steps):
            events[i].record()
            step()
        events[-1].record()
        torch.cuda.synchronize()
        for i in range(len(steps)):
            samples[i].append(events[i].elapsed_time(events[i + 1]) * 1e3)
    return [statistics.median(s) for s in samples]


def graph_of(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """fn captured in a CUDA graph (after a warm-up on a side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def median_us(fn: Callable[[], object], rep_ms: float = 200) -> float:
    from ..kernels.timing import time_us

    return time_us(fn, warmup_ms=25, rep_ms=rep_ms)


def host_overhead_us(executor, x: torch.Tensor, calls: int = 50, bound: bool = False
                     ) -> float:
    """Host time of one forward call (input copy, graph replay, output clone), measured while
    the GPU is held busy so no call waits for it; the non-finite check is off (it syncs).
    bound: the input written once into the executor's `input_buffer` and the output left in
    its buffer (`copy_output=False`): the replay and the call's checks only."""
    check = executor.check_finite
    executor.check_finite = False
    if bound:
        executor.input_buffer.copy_(x)
        x = executor.input_buffer
    kw = {"copy_output": False} if bound else {}
    try:
        executor(x, **kw)
        torch.cuda.synchronize()
        torch.cuda._sleep(int(200 * 1.5e6))
        t0 = time.perf_counter()
        for _ in range(calls):
            executor(x, **kw)
        dt = (time.perf_counter() - t0) / calls
        torch.cuda.synchronize()
    finally:
        executor.check_finite = check
    return dt * 1e6


# ------------------------------------------------------------------------------ floors
def step_floor_us(plan: Plan, step, image_in: bool = False) -> float:
    """Roofline floor of one step (module docstring), microseconds; image_in: the step reads
    the float image instead of its quantized input (the fused stem)."""
    inputs = (plan.input, *step.inputs[1:]) if image_in else step.inputs
    nbytes = sum(plan.tensors[t].nbytes for t in (*inputs, *step.outputs)
                 if t in plan.tensors)
    ops = 0.0
    peak = PEAK_OPS["int8"]
    if isinstance(step, Layer):
        wl = step.workload
        m, n, k = wl.gemm_shape
        ops = 2.0 * m * n * k
        nbytes += layer_weight_bytes(step, plan.params[step.weight])
        if is_bitserial(step.impl):
            peak = PEAK_OPS["bitserial"] / (wl.w.bits * wl.a.bits)
        elif step.impl == "torch.fp16":
            peak = PEAK_OPS["fp16"]
    return max(ops / peak, nbytes / BANDWIDTH) * 1e6

