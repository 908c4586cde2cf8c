"""One "network" results row (`bench_network`): a calibrated quantized model compiled for
the GPU executor, timed against PyTorch fp16 in the same process.

The row holds the engine's forward (CUDA graph replay, median of many, L2 flushed between runs
like the baselines), host overhead per forward, per-step times in the engine and alone with
their roofline floors (`timing`), the fp16 baselines (`baselines`) and memory against fp16.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from ..graph.ir import Plan
from ..graph.launches import PlanOptions
from ..graph.stem_choice import stem_text
from .baselines import fp16_baselines
from .recipes import IMAGE_SIZE, build_quantized, compile_plan, random_images
from .timing import cuda_events_us, host_overhead_us, step_floor_us, step_times_us

#: fp16 baselines by (model, batch, image size, compile mode): measured once per process
_BASELINES: dict[tuple, tuple[dict, dict]] = {}


@dataclass(frozen=True)
class BenchCase:
    """One network row; exact_bias False: the plan with biases in accumulator units (the
    kernels' own fused epilogues where a layer has one output)."""

    model: str
    batch: int
    precision: str
    image_size: int | None = None
    exact_bias: bool = True
    wide_bits: int = 24
    #: `impl_chooser`'s name of the per-layer implementation policy
    chooser: str = "default"
    #: int8 implicit-GEMM layers write their layer epilogue's outputs themselves
    #: (`PlanOptions.fuse_outputs`)
    fuse_outputs: bool = True
    #: the tuning records the plan reads (False: every layer's default config)
    records: str | bool | None = False
    #: the quantized model's residual stream (`lowbit.quantize(residual_bits=...)`; None: the
    #: engine's wide realization)
    residual_bits: int | None = None
    #: the approximate 32-bit requantizations (`PlanOptions.requant32`; False, as
    #: `lowbit.compile`: the plan equals `convert` at every precision)
    requant32: bool = False
    #: exact block ends as the guarded 32-bit sum where its band is narrow
    #: (`PlanOptions.guarded_block_ends`; False: the plain 64-bit sum)
    guarded_block_ends: bool = True
    #: the fused first layer's kernel (`PlanOptions.stem_kernel`; None: the shape's default)
    stem_kernel: str | None = None


def case_plan(case: BenchCase, device: torch.device | str, *, seed: int = 0,
              chain: bool = True) -> tuple[torch.nn.Module, torch.Tensor, Plan, str]:
    """(float model, input images, plan, where it was traced) of `case` on `device`: the
    model built and calibrated as `build_quantized`, planned as `compile_plan` with the
    case's options (what `bench_network` times; probes bind the same plan)."""
    size = case.image_size or IMAGE_SIZE.get(case.model, 224)
    q, float_model = build_quantized(case.model, case.precision, image_size=size, seed=seed,
                                     device=device, residual_bits=case.residual_bits)
    x = random_images(case.batch, size, 1 if case.model.startswith("digits") else 3,
                      seed + 2, device)
    options = PlanOptions(fuse_outputs=case.fuse_outputs, chain=chain, requant32=case.requant32,
                          guarded_block_ends=case.guarded_block_ends,
                          stem_kernel=case.stem_kernel)
    plan, where = compile_plan(q, x, case.exact_bias, case.wide_bits, case.chooser, options,
                               case.records)
    return float_model, x, plan, where


def bench_network(case: BenchCase, *, compile_mode: str | None = "max-autotune",
                  seed: int = 0, chain: bool = True, quick: bool = False,
                  check: bool = True) -> dict:
    """One "network" results row for `case` on the current GPU (module docstring)."""
    from ..runtime.engine import ReferenceExecutor
    from ..runtime.gpu import GpuExecutor

    device = torch.device("cuda")
    size = case.image_size or IMAGE_SIZE.get(case.model, 224)
    row: dict = {"model": case.model, "batch": case.batch, "precision": case.precision,
                 "image_size": size}
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    float_model, x, plan, where = case_plan(case, device, seed=seed, chain=chain)
    phases["plan_s"] = time.perf_counter() - t0
    row["planned_on"] = where
    row["exact_bias"] = case.exact_bias
    row["wide_bits"] = case.wide_bits
    row["chooser"] = "tuned" if case.records else case.chooser
    row["config_sources"] = plan.config_sources()
    row["fuse_outputs"] = case.fuse_outputs
    row["requant32"] = case.requant32
    row["stem_kernel"] = case.stem_kernel
    row["guarded_block_ends"] = case.guarded_block_ends
    row["block_ends"] = {k: sum(1 for s in plan.layers if s.workload.epilogue.requant32 and (
        s.workload.epilogue.guarded, s.workload.epilogue.sum64) == v)
        for k, v in (("guarded", (True, True)), ("sum64", (False, True)),
                     ("sum32", (False, False)))}
    row["stem"] = next((stem_text(s) for s in plan.layers if s.stem), None)
    row["residual_bits"] = case.residual_bits
    t0 = time.perf_counter()
    ex = GpuExecutor(plan, device)
    phases["bind_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    y = ex(x)
    torch.cuda.synchronize()
    phases["first_forward_s"] = time.perf_counter() - t0
    if check and case.batch <= 16:
        ref = ReferenceExecutor(plan, device)(x)
        row["top1_equal"] = bool(torch.equal(y.argmax(1), ref.argmax(1)))
        row["logits_equal"] = bool(torch.equal(y, ref))
    rep_ms = 100 if quick else 300
    from ..kernels.timing import time_us

    row["time_ms"] = time_us(ex.replay, warmup_ms=25, rep_ms=rep_ms) / 1e3
    row["images_per_s"] = case.batch / (row["time_ms"] / 1e3)
    row["host_overhead_us"] = host_overhead_us(ex, x)
    row["host_overhead_bound_us"] = host_overhead_us(ex, x, bound=True)
    inside = step_times_us([b for b in ex.steps if not b.record_only], reps=5 if quick else 10)
    run = [b for b in ex.steps if not b.record_only]
    total = sum(inside) or 1.0
    layers = []
    for b, t in zip(run, inside, strict=True):
        if not b.launches:
            continue
        reps = 10 if quick else 30
        alone = statistics.median(cuda_events_us(b, reps=reps))
        layers.append({"name": b.name, "impl": b.how, "time_us": t,
                       "floor_us": step_floor_us(plan, b.step, b.how.startswith("triton stem")),
                       "share": t / total,
                       "alone_us": alone,
                       # each launch of a multi-launch step alone (kernel, epilogue pass, ...)
                       "launches_us": [statistics.median(cuda_events_us(f, reps=reps))
                                       for f in b.launches] if len(b.launches) > 1 else None,
                       "source": list(getattr(b.step, "source", ())),
                       "config_source": getattr(b.step, "config_source", "") or None})
    row["layers"] = layers
    row["floor_ms"] = sum(r["floor_us"] for r in layers) / 1e3
    row["steps_sum_ms"] = total / 1e3
    row["weights_bytes"] = plan.weight_bytes()
    row["peak_activation_bytes"] = plan.peak_activation_bytes()
    row["arena_bytes"] = ex.nbytes()
    row["fp16_weights_bytes"] = 2 * sum(p.numel() for p in float_model.parameters())
    key = (case.model, case.batch, size, compile_mode)
    if key not in _BASELINES:  # the float model is the same for every recipe
        _BASELINES[key] = fp16_baselines(float_model, x, compile_mode)
    baselines, notes = _BASELINES[key]
    baselines, notes = dict(baselines), dict(notes)
    row["baselines_ms"] = baselines
    row["fp16_peak_activation_bytes"] = notes.pop("fp16_peak_activation_bytes", None)
    modules = notes.pop("fp16_modules_us", {})
    for r in layers:
        r["fp16_us"] = sum(modules.get(s, 0.0) for s in r["source"]) or None
    row["notes"] = {**notes, **{k: round(v, 2) for k, v in phases.items()}}
    return row

