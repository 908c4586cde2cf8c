"""Whole-network benchmarks (`lowbit bench`, benchmarks/network.py): a calibrated quantized
zoo model compiled for the GPU executor, timed against PyTorch fp16 in the same process.

- `build_quantized(name, recipe, ...)`: the zoo model (`lowbit.models`), or a torchvision
  model 'tv:NAME' / a file's 'path.py:fn' (`model_source`), quantized by a precision recipe
  and calibrated on random images. Recipes: "wXaY" (every conv / linear at
  X-bit weights and Y-bit activations except the first conv and the last linear at w8a8, the
  issue-32 setting), "wXaY-all" (every layer), "mixed" (first / last w8a8, the others cycling
  through w1a2, w2a2, w4a4, w8a8: every kind of layout change between layers).
- `bench_network(...)`: one "network" results row: the engine's forward (CUDA
  graph replay, median of many, L2 flushed between runs like the baselines), host overhead
  per forward, per-step times in the engine and alone (CUDA events behind a sleep that queues
  the launches first, so launch gaps do not count; alone with L2 flushed before each call, as
  a step finds it inside the forward) with their roofline floors, and the
  baselines: PyTorch fp16 channels_last eager (cudnn.benchmark), the same under CUDA-graph
  replay and torch.compile fp16 (`compile_mode`; timed under a CUDA graph where the mode
  leaves graphs to the caller), memory against fp16.
- `check_targets(rows)`: the issue-32 targets as met / missed with the number that bounds them.

Floors (H100, `core.hardware.GpuSpec`): bytes / 3.0 TB/s against ops / peak per
implementation: bit-serial 10,279 T bit-ops/s / (w_bits a_bits), int8 1,280 TOPS, fp16
648 TFLOPS; bytes are the step's ideal traffic (inputs, weights and outputs in their stored
layouts, no int32 round trip).
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ..graph.impl import ImplChooser, is_bitserial
from ..graph.ir import Layer, Plan, layer_weight_bytes
from ..graph.launches import PlanOptions
from .model_source import external_model, is_external

BANDWIDTH = 3.0e12
PEAK_OPS = {"bitserial": 10_279e12, "int8": 1_280e12, "fp16": 648e12}
#: zoo networks a recipe runs on, with their default input size
IMAGE_SIZE = {"resnet18": 224, "resnet34": 224, "resnet50": 224, "vgg16": 224,
              "alexnet": 224, "apnn_vgg_variant": 32, "digits_resnet": 8, "digits_cnn": 8}
MIX_CYCLE = ((1, 2), (2, 2), (4, 4), (8, 8))


# ------------------------------------------------------------------------------ models
def conv_linear_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if type(m) in (nn.Conv2d, nn.Linear)]


def parse_recipe(recipe: str) -> tuple[int | None, int | None, bool]:
    """'w1a2' -> (1, 2, False); 'w4a4-all' -> (4, 4, True); 'mixed' -> (None, None, False)."""
    if recipe == "mixed":
        return None, None, False
    body, _, suffix = recipe.partition("-")
    try:
        if body[0] != "w" or "a" not in body or suffix not in ("", "all"):
            raise ValueError
        w, a = body[1:].split("a")
        bits = int(w), int(a)
    except ValueError:
        raise ValueError(f"recipe must be 'wXaY', 'wXaY-all' or 'mixed', got {recipe!r}") \
            from None
    if not all(1 <= b <= 8 for b in bits):
        raise ValueError(f"recipe bits must be in 1..8, got {recipe!r}")
    return bits[0], bits[1], suffix == "all"


def recipe_layers(model: nn.Module, recipe: str) -> tuple[int, int, dict[str, dict]]:
    """(weight_bits, act_bits, per-layer overrides) of `lowbit.quantize` for a recipe."""
    w, a, every = parse_recipe(recipe)
    names = conv_linear_names(model)
    eight = {"weight_bits": 8, "act_bits": 8}
    if w is None:
        layers = {n: dict(zip(("weight_bits", "act_bits"), MIX_CYCLE[i % len(MIX_CYCLE)],
                              strict=True)) for i, n in enumerate(names[1:-1])}
        layers.update({names[0]: eight, names[-1]: eight})
        return 1, 2, layers
    return w, a, ({} if every or len(names) < 2 else {names[0]: eight, names[-1]: eight})


def randomize_batchnorms(model: nn.Module, seed: int) -> None:
    """Random running statistics and affine parameters (folding then does something)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                k = m.num_features
                m.running_mean.copy_(torch.randn(k, generator=g) * 0.3)
                m.running_var.copy_(torch.rand(k, generator=g) + 0.5)
                m.weight.copy_(torch.rand(k, generator=g) + 0.5)
                m.bias.copy_(torch.randn(k, generator=g) * 0.2)


def random_images(batch: int, size: int | tuple[int, int], channels: int = 3, seed: int = 0,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    hw = (size, size) if isinstance(size, int) else tuple(size)
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, channels, *hw, generator=g).to(device)


def build_quantized(name: str, recipe: str, *, image_size: int | tuple[int, int] | None = None,
                    width: float = 1.0, num_classes: int = 1000, seed: int = 0,
                    calib_batch: int = 4, device: torch.device | str = "cpu",
                    residual_bits: int | None = None,
                    **options: object) -> tuple[nn.Module, nn.Module]:
    """(fake-quant model calibrated on `calib_batch` random images, the float model it came
    from), both on `device` in eval mode; residual_bits as `lowbit.quantize`'s. Options go
    to `lowbit.models.get`."""
    import lowbit.models as zoo

    from ..quant.api import quantize_model
    from ..quant.calibrate import calibrate

    torch.manual_seed(seed)
    model = external_model(name, num_classes) if is_external(name) else zoo.get(
        name, num_classes=num_classes, width=width, **options).eval()
    randomize_batchnorms(model, seed)
    w, a, layers = recipe_layers(model, recipe)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = quantize_model(model, weight_bits=w, act_bits=a, layers=layers,
                           residual_bits=residual_bits)
    model, q = model.to(device), q.to(device).eval()
    channels = 1 if name.startswith("digits") else 3
    size = image_size or IMAGE_SIZE.get(name, 224)
    calibrate(q, [random_images(calib_batch, size, channels, seed + 1, device)])
    return q, model


def compile_plan(q: nn.Module, x: torch.Tensor, exact_bias: bool = True, wide_bits: int = 24,
                 chooser: str = "default", options: PlanOptions | None = None,
                 records: str | bool | None = False) -> tuple[Plan, str]:
    """The plan of `q` for x's shape, traced on x's device; if that fails, traced on the CPU
    on two of x's images and planned for x's shape ((plan, where it was traced)).
    exact_bias=False: biases rounded to accumulator units (`lowbit.graph.build_plan`), which
    lets single-output layers use their kernel's own epilogue. wide_bits, options and records:
    as `lowbit.compile`'s (records: the tuned configs of the layers; False: the defaults).
    chooser: `impl_chooser`'s name."""
    import copy

    from ..graph import build_plan
    from .compiled import compile_model

    choose = impl_chooser(chooser)
    kw = dict(executor="reference", wide_bits=wide_bits, chooser=choose, records=records,
              options=options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cm, where = compile_model(q, x, **kw), str(x.device)
        except Exception as e:  # the planner is exercised on the CPU: fall back to it
            where = f"cpu (on {x.device}: {type(e).__name__}: {e}"[:200] + ")"
            cm = compile_model(copy.deepcopy(q).cpu(), x[:2].cpu(), **kw)
        shape = tuple(x.shape)
        if exact_bias:
            return cm.plan_for(shape), where
        return build_plan(cm.dataflow, shape, cm.chooser, cm.wide_bits, exact_bias=False,
                          options=cm.options), where


def impl_chooser(name: str) -> str | ImplChooser:
    """The chooser called `name`: "default" (`lowbit.compile`'s measured policy), "model"
    (the performance model, `lowbit.graph.ModelChooser`), or an int8 template's name (the
    default policy with that template tried first, `lowbit.graph.int8_preferring`)."""
    if name in ("default", "model"):
        return name
    from ..graph import int8_preferring

    return int8_preferring(name)


def network_workloads(name: str, batch: int, precision: str, *,
                      image_size: int | tuple[int, int] | None = None
                      ) -> list[tuple[str, object]]:
    """The distinct kernel workloads of zoo network `name` at `batch` under a precision recipe
    (`parse_recipe`), as the engine would plan them: [(layer name, Workload)] in execution
    order, one entry per distinct workload (what `lowbit tune --model` tunes). Planned on the
    CPU from a model calibrated on two random images; no GPU needed."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an int >= 1, got {batch!r}")
    size = image_size or IMAGE_SIZE.get(name, 224)
    q, _ = build_quantized(name, precision, image_size=size, calib_batch=2)
    channels = 1 if name.startswith("digits") else 3
    from .compiled import compile_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cm = compile_model(q, random_images(2, size, channels, seed=3), executor="reference")
    hw = (size, size) if isinstance(size, int) else tuple(size)
    plan = cm.plan_for((batch, channels, *hw))
    seen: dict[str, tuple[str, object]] = {}
    for step in plan.layers:
        if step.impl == "torch.fp16":
            continue
        seen.setdefault(step.workload.key, (step.name, step.workload))
    return list(seen.values())

# ------------------------------------------------------------------------------ timing
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


# ------------------------------------------------------------------------------ baselines
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


# ------------------------------------------------------------------------------ one row
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


def bench_network(case: BenchCase, *, compile_mode: str | None = "max-autotune",
                  seed: int = 0, chain: bool = True, quick: bool = False,
                  check: bool = True) -> dict:
    """One "network" results row for `case` on the current GPU (module docstring)."""
    from .engine import ReferenceExecutor
    from .gpu import GpuExecutor

    device = torch.device("cuda")
    size = case.image_size or IMAGE_SIZE.get(case.model, 224)
    row: dict = {"model": case.model, "batch": case.batch, "precision": case.precision,
                 "image_size": size}
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    q, float_model = build_quantized(case.model, case.precision, image_size=size, seed=seed,
                                     device=device, residual_bits=case.residual_bits)
    x = random_images(case.batch, size, 1 if case.model.startswith("digits") else 3,
                      seed + 2, device)
    options = PlanOptions(fuse_outputs=case.fuse_outputs, chain=chain)
    plan, where = compile_plan(q, x, case.exact_bias, case.wide_bits, case.chooser, options,
                               case.records)
    phases["plan_s"] = time.perf_counter() - t0
    row["planned_on"] = where
    row["exact_bias"] = case.exact_bias
    row["wide_bits"] = case.wide_bits
    row["chooser"] = "tuned" if case.records else case.chooser
    row["fuse_outputs"] = case.fuse_outputs
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
                       "source": list(getattr(b.step, "source", ()))})
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


# ------------------------------------------------------------------------------ targets
@dataclass(frozen=True)
class Target:
    name: str
    value: float | None
    bound: float
    met: bool | None
    why: str = ""


def _row(rows: list[dict], model: str, batch: int, precision: str) -> dict | None:
    """The fastest default row of (model, batch, precision) (any residual stream, exact
    biases, the default wide width)."""
    found = [r for r in rows if (r.get("model"), r.get("batch"), r.get("precision")) ==
             (model, batch, precision) and r.get("time_ms") and r.get("exact_bias", True)
             and r.get("wide_bits", 24) == 24]
    return min(found, key=lambda r: r["time_ms"]) if found else None


def _bottleneck(row: dict) -> str:
    """What bounds a row: its floor and its three largest steps against their floors."""
    top = sorted(row.get("layers", []), key=lambda r: -r["time_us"])[:3]
    parts = [f"{r['name']} {r['time_us']:.1f} us (floor {r['floor_us']:.1f})" for r in top]
    return f"network floor {row.get('floor_ms', 0):.3f} ms; largest: " + ", ".join(parts)


#: TensorRT int8 ResNet-50 in MLPerf Inference v4.0 (Offline), one H100 SXM: the deploying
#: user's reference (cited: it cannot run here), images per second
TENSORRT_INT8_RESNET50_IMAGES_S = 88_714


def check_targets(rows: list[dict]) -> list[Target]:
    """The dataflow targets over the rows present (missing rows: met None): ResNet-50 at
    batch 256 against TensorRT int8's cited throughput and its own floor sum, ResNet-18 at
    batch 8, and every first layer within 3x its floor."""
    out: list[Target] = []

    def add(name: str, value: float | None, bound: float, higher: bool, r: dict | None) -> None:
        met = None if value is None else (value >= bound if higher else value <= bound)
        out.append(Target(name, value, bound, met, "" if met or r is None else _bottleneck(r)))

    for precision, bound in (("w1a2", 100_000), ("w2a2", TENSORRT_INT8_RESNET50_IMAGES_S),
                             ("w8a8", 60_000)):
        r = _row(rows, "resnet50", 256, precision)
        add(f"ResNet-50 {precision} b256 images/s >=", r and r["images_per_s"], bound, True, r)
        if r is not None and r.get("floor_ms"):
            add(f"ResNet-50 {precision} b256 time / floor sum <=",
                r["time_ms"] / r["floor_ms"], 1.5, False, r)
    r18 = _row(rows, "resnet18", 8, "w1a2")
    add("ResNet-18 w1a2 b8 time (ms) <=", r18 and r18["time_ms"], 0.10, False, r18)
    for r in rows:
        stems = [s for s in r.get("layers", []) if s["impl"].startswith("triton stem")]
        for s in stems:
            v = s["time_us"] / s["floor_us"]
            out.append(Target(f"{r['model']} b{r['batch']} first layer time / floor <=", v, 3.0,
                              v <= 3.0, f"{s['time_us']:.1f} us, floor {s['floor_us']:.1f}"))
    return out


def summary_table(rows: list[dict]) -> str:
    """A short text table of the rows and the targets."""
    lines = [f"{'model':<10} {'b':>4} {'prec':<10} {'ms':>8} {'img/s':>9} {'eager':>7} "
             f"{'graph':>7} {'compile':>7} {'x graph':>7} {'x comp':>7} {'floor':>7}  note"]
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['model']:<10} {r['batch']:>4} {r['precision']:<6} error: "
                         f"{r['error'][:80]}")
            continue
        b = r["baselines_ms"]

        def f(v: float | None) -> str:
            return f"{v:7.3f}" if v else "      -"

        x = b.get("fp16_cuda_graph") / r["time_ms"] if b.get("fp16_cuda_graph") else None
        xc = b.get("fp16_compile") / r["time_ms"] if b.get("fp16_compile") else None
        prec = r["precision"] + ("" if r.get("wide_bits", 24) == 24 else f"/{r['wide_bits']}") \
            + (f"/res{r['residual_bits']}" if r.get("residual_bits") else "")
        lines.append(f"{r['model']:<10} {r['batch']:>4} {prec:<10} "
                     f"{r['time_ms']:8.3f} {r['images_per_s']:9.0f} {f(b.get('fp16_eager'))} "
                     f"{f(b.get('fp16_cuda_graph'))} {f(b.get('fp16_compile'))} "
                     f"{(f'{x:6.2f}x') if x else '      -'} "
                     f"{(f'{xc:6.2f}x') if xc else '      -'} {r['floor_ms']:7.3f}  "
                     f"host {r['host_overhead_us']:.1f} us"
                     + (f" (bound {r['host_overhead_bound_us']:.1f})"
                        if r.get("host_overhead_bound_us") else "")
                     + ("" if r.get("top1_equal", True) else "  TOP-1 MISMATCH"))
    lines.append(f"{'TensorRT int8 (MLPerf v4.0, one H100, cited)':<40} resnet50 b256 "
                 f"{256e3 / TENSORRT_INT8_RESNET50_IMAGES_S:8.3f} ms "
                 f"{TENSORRT_INT8_RESNET50_IMAGES_S:9,} images/s")
    lines.append("")
    for t in check_targets(rows):
        state = "n/a " if t.met is None else ("met " if t.met else "MISS")
        val = "-" if t.value is None else (f"{t.value:.3f}" if t.value < 1000 else
                                           f"{t.value:,.0f}")
        lines.append(f"[{state}] {t.name} {t.bound:g}: {val}  {t.why}")
    return "\n".join(lines)


def per_layer_figure(row: dict, path: str) -> str | None:
    """Bar chart of where the time goes per step (ours) next to fp16 eager per module; None
    when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    layers = row["layers"]
    n = len(layers)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.28 * n), 4.0))
    xs = range(n)
    ax.bar([i - 0.2 for i in xs], [r["time_us"] for r in layers], 0.4, label="lowbit")
    ax.bar([i + 0.2 for i in xs], [r.get("fp16_us") or 0 for r in layers], 0.4,
           label="PyTorch fp16 eager (module)")
    ax.plot(list(xs), [r["floor_us"] for r in layers], "k_", markersize=8, label="floor")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["name"].split(".", 1)[-1][:18] for r in layers], rotation=90,
                       fontsize=6)
    ax.set_ylabel("us")
    title = f"{row['model']} b{row['batch']} {row['precision']}: {row['time_ms']:.3f} ms"
    title += f" (floor sum {row['floor_ms']:.3f} ms"
    if row["model"] == "resnet50":  # the whole network's time per step against TensorRT's
        trt_ms = row["batch"] * 1e3 / TENSORRT_INT8_RESNET50_IMAGES_S
        ax.axhline(trt_ms * 1e3 / max(n, 1), color="r", linestyle="--", linewidth=0.8,
                   label=f"TensorRT int8 (cited), {trt_ms:.3f} ms / {n} steps")
        title += f"; TensorRT int8 {trt_ms:.3f} ms"
    ax.set_title(title + ")")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
