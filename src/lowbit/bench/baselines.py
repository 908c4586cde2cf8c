"""PyTorch fp16 baselines of a network, timed in the same process as the engine: eager
channels_last (cudnn.benchmark), the same under CUDA-graph replay, and torch.compile
(`compile_baseline_ms`; timed under a CUDA graph where the mode leaves graphs to the caller),
with the fp16 peak activation bytes and each conv / linear module's eager time."""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from ..runtime.model_source import external_model, is_external
from .recipes import randomize_batchnorms
from .timing import graph_of, median_us


def fp16_baselines(model: nn.Module, x: torch.Tensor, compile_mode: str | None
                   ) -> tuple[dict[str, float | None], dict[str, object]]:
    """{fp16_eager, fp16_cuda_graph, fp16_compile} in ms and notes (errors, the fp16 peak
    activation bytes, per-module eager times by module name)."""
    torch.backends.cudnn.benchmark = True
    m = _fp16_copy(model)
    xh = x.to(torch.float16).contiguous(memory_format=torch.channels_last)
    out: dict[str, float | None] = {"fp16_eager": None, "fp16_cuda_graph": None,
                                    "fp16_compile": None}
    notes: dict[str, object] = {}
    with torch.no_grad():
        m(xh)
        out["fp16_eager"] = median_us(lambda: m(xh)) / 1e3
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        m(xh)
        torch.cuda.synchronize()
        notes["fp16_peak_activation_bytes"] = int(torch.cuda.max_memory_allocated() - base)
        notes["fp16_modules_us"] = _module_times_us(m, xh)
        try:
            g = graph_of(lambda: m(xh))
            out["fp16_cuda_graph"] = median_us(g.replay) / 1e3
        except Exception as e:
            notes["fp16_cuda_graph_error"] = f"{type(e).__name__}: {e}"[:300]
        if compile_mode:
            out["fp16_compile"], more = compile_baseline_ms(m, xh, compile_mode)
            notes.update(more)
    return out, notes


def compile_baseline_ms(m: nn.Module, xh: torch.Tensor, mode: str
                        ) -> tuple[float | None, dict[str, object]]:
    """torch.compile(mode) of the fp16 model `m` on xh: median ms (under a CUDA graph where
    the mode leaves graphs to the caller) and notes (compile seconds, or the error)."""
    notes: dict[str, object] = {"fp16_compile_mode": mode}
    try:
        with torch.no_grad():
            t0 = time.perf_counter()
            cm = torch.compile(m, mode=mode)
            cm(xh)
            cm(xh)
            notes["fp16_compile_s"] = round(time.perf_counter() - t0, 1)
            if "cudagraphs" in mode or mode in ("reduce-overhead", "max-autotune"):
                return median_us(lambda: cm(xh)) / 1e3, notes
            g = graph_of(lambda: cm(xh))
            return median_us(g.replay) / 1e3, notes
    except Exception as e:  # a failing baseline is reported, not fatal
        notes["fp16_compile_error"] = f"{type(e).__name__}: {e}"[:300]
        return None, notes


def fp16_model(name: str, seed: int = 0, **options: object) -> nn.Module:
    """The float zoo model `build_quantized` starts from, in fp16 channels_last on the GPU."""
    import lowbit.models as zoo

    torch.manual_seed(seed)
    model = external_model(name) if is_external(name) else zoo.get(name, **options).eval()
    randomize_batchnorms(model, seed)
    return _fp16_copy(model).cuda()


def _fp16_copy(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model).half().eval().to(memory_format=torch.channels_last)


def _module_times_us(model: nn.Module, x: torch.Tensor, reps: int = 5) -> dict[str, float]:
    """Eager fp16 time of every conv / linear module (events around each, launches queued
    behind a sleep), median of `reps` forwards."""
    samples: dict[str, list[float]] = {}
    handles, pending = [], []
    for name, mod in model.named_modules():
        if type(mod) not in (nn.Conv2d, nn.Linear):
            continue

        def pre(_m, _a, name=name):
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            pending.append((name, ev))

        def post(_m, _a, _o, name=name):
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            pending.append((name, ev))

        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    try:
        for _ in range(reps):
            pending.clear()
            torch.cuda.synchronize()
            torch.cuda._sleep(int(30 * 1.5e6))
            model(x)
            torch.cuda.synchronize()
            for (n0, e0), (_, e1) in zip(pending[::2], pending[1::2], strict=True):
                samples.setdefault(n0, []).append(e0.elapsed_time(e1) * 1e3)
    finally:
        for h in handles:
            h.remove()
    return {n: statistics.median(v) for n, v in samples.items()}

