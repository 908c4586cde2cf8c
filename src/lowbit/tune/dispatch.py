"""Dispatch without tuning: the recorded best, else the performance model's pick.

`kernel_for(workload)` builds the fastest recorded (template, config) of the workload; without
a record, the untuned bit-serial kernel (`lowbit.kernels.cuda.default_bitserial`) where a
bit-serial family runs the workload, else what `choose` predicts fastest among our templates.
`choose` is what the network engine asks per layer: every template that supports the layer,
each with a small candidate set — its default config plus configs drawn near it and across its
space, ranked by the model (`lowbit.perfmodel.predict`) — and PyTorch fp16 (cuDNN conv /
cuBLAS matmul, `TORCH_FP16`) as one more candidate, estimated by the analytic model calibrated on
the recorded fp16 baselines. A non-default config must be predicted `margin` faster than the
default to be picked: the default is the config the kernels' authors measured, a far config
only the model. The bit-serial families compete as one group whose default is
`default_bitserial`'s kernel: every family's candidates (its own default first) must beat that
one by the margin. A weight-streaming template (`streams_weights`, e.g. `triton.gemv_int8`),
which the learned model has no measurements of, is timed by `stream_estimate_us` instead.
`choose_measured` / `measure_top` (`lowbit tune --top 3`) time the model's top few of the
same pool and keep the fastest: a few builds instead of a tune.
"""

from __future__ import annotations

import inspect
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core import Config, ConfigSpace, Workload
from ..core.hardware import GpuSpec, gpu_spec_for
from ..kernels import load_backends
from ..kernels.base import (
    TORCH_FP16,
    Kernel,
    KernelTemplate,
    block_end_refusal,
    get_template,
    templates,
)
from ..kernels.cuda import FAMILIES, default_bitserial
from ..perfmodel.launch import launch_shape
from ..perfmodel.occupancy import occupancy
from ..perfmodel.predict import default_model, predict_many
from ..perfmodel.roofline import workload_bytes
from .records import Record, RecordsDB

DEFAULT_MARGIN = 0.10
#: constants of `stream_estimate_us`: the fewest events-scale microseconds of any kernel in the
#: measurement snapshot (5.6 us: launch, events, a minimal prologue and epilogue); a loaded DRAM
#: round trip a weight tile waits for; the mma.sync int8 efficiency on padded rows (the
#: analytic model's "int8_mma_sync"-class figure, rounded up: the skinny dot is no bottleneck)
STREAM_OVERHEAD_US = 5.5
STREAM_LATENCY_US = 1.0
STREAM_MMA_EFFICIENCY = 0.5
#: int32 atomic adds per second into distinct L2 lines (order of magnitude, Hopper)
ATOMICS_PER_S = 1.0e11


@dataclass(frozen=True)
class Choice:
    """What to run a layer with: `template` (a template name, or TORCH_FP16) and its
    `config` (None for TORCH_FP16), the predicted (or recorded) time, why, and the runners-up
    per template."""

    template: str
    config: Config | None
    predicted_us: float
    reason: str
    alternatives: tuple[tuple[str, float], ...] = ()


def best_record(workload: Workload, db: RecordsDB | str | Path | None = None,
                gpu: str | None = None) -> Record | None:
    """Fastest verified measurement of `workload` (on `gpu` when given) in the records."""
    if isinstance(db, RecordsDB):
        return db.best(workload, gpu)
    with RecordsDB(db) as records:
        return records.best(workload, gpu)


def _with_arch(fn, workload: Workload, arch: str | None):
    """fn(workload) or fn(workload, arch=arch) for the templates whose spaces depend on it."""
    if arch and "arch" in inspect.signature(fn).parameters:
        return fn(workload, arch=arch)
    return fn(workload)


def _target_arch(spec: GpuSpec) -> str | None:
    """The arch to shape spaces for when predicting for `spec` on a machine without its GPU
    (None: the templates' own choice, the current device's)."""
    import torch

    if torch.cuda.is_available():
        return None
    return "sm_90a" if any(n in spec.name.upper() for n in ("H100", "H200", "H800")) else None


def candidate_configs(template: KernelTemplate, workload: Workload, n: int = 48,
                      seed: int = 0, budget_s: float = 0.05, arch: str | None = None
                      ) -> list[Config]:
    """The default config, its valid one-knob neighbours, short random walks from it and
    uniform random draws of valid points, without enumerating the space (bit-serial spaces
    take seconds to enumerate): at most about `n` distinct configs, default first."""
    space: ConfigSpace = _with_arch(template.space, workload, arch)
    default = _with_arch(template.default_config, workload, arch)
    rng = random.Random(seed)
    out: dict[Config, None] = {default: None}
    for c in space.neighbors(default):
        out.setdefault(c)
    deadline = time.perf_counter() + budget_s
    walkers = [default] * 4
    while len(out) < n and time.perf_counter() < deadline:
        walkers = [space.mutate(w, rng) for w in walkers]
        for w in walkers:
            out.setdefault(w)
        draw = Config({k.name: rng.choice(k.values) for k in space.knobs})
        if space.is_valid(draw):
            out.setdefault(draw)
    return list(out)


def stream_estimate_us(template: KernelTemplate, workload: Workload, config: Config,
                       spec: GpuSpec) -> float:
    """Events-scale time (microseconds) of a weight-streaming template's `config` (a documented
    bytes / bandwidth + launch estimate, not the learned model):

        STREAM_OVERHEAD_US + max(stream, compute, atomics) + waves x STREAM_LATENCY_US

    stream: the fewest bytes (`roofline.workload_bytes`) over the bandwidth the launch reaches,
    by Little's law the bytes it keeps in flight (resident programs x (stages - 1) weight
    tiles, at most the program's own slice) per STREAM_LATENCY_US, at most the GPU's peak;
    compute: the rows padded to the dot's block_m on mma.sync int8; atomics: the split-K
    partial sums (M x N x SPLIT_K int32 adds), which overlap the stream; waves: grid blocks
    over the resident slots (occupancy from the template's `launch_shape`)."""
    s = launch_shape(workload, config, template)
    m, n, k = workload.gemm_shape
    occ = occupancy(s.threads, s.regs_per_thread, s.smem_bytes, spec)
    slots = spec.sms * max(occ.blocks_per_sm, 1)
    w_bytes = workload_bytes(workload) * s.block_n / max(n, 1)  # one tile's share
    per_program = w_bytes / max(s.split_k, 1)
    tile = min(per_program, s.block_n * s.block_k * workload.w.bits / 8)
    in_flight = min(s.grid_blocks, slots) * min(per_program, max(1, s.stages - 1) * tile)
    bandwidth = min(spec.bandwidth, in_flight / (STREAM_LATENCY_US * 1e-6))
    stream = workload_bytes(workload) / bandwidth * 1e6
    compute = 2 * s.block_m * n * k / (spec.int8_mma_sync * STREAM_MMA_EFFICIENCY) * 1e6
    atomics = m * n * s.split_k / ATOMICS_PER_S * 1e6 if s.split_k > 1 else 0.0
    waves = math.ceil(s.grid_blocks / slots)
    return STREAM_OVERHEAD_US + max(stream, compute, atomics) + waves * STREAM_LATENCY_US


def _predicted(template: KernelTemplate, workload: Workload, configs: Sequence[Config],
               spec: GpuSpec, model) -> list[float]:
    """Predicted times of `configs`: `stream_estimate_us` for a weight-streaming template
    (`streams_weights`), else the model (`predict_many`)."""
    if getattr(template, "streams_weights", False):
        return [stream_estimate_us(template, workload, c, spec) for c in configs]
    return [float(p) for p in predict_many(template, workload, configs, spec, model)]


def _usable(workload: Workload, pool: Sequence[KernelTemplate] | None) -> list[KernelTemplate]:
    if pool is None:
        load_backends()
        pool = templates()
    out = []
    for t in pool:
        try:
            if t.supports(workload):
                out.append(t)
        except Exception:  # a template that cannot even judge (missing toolchain): skip
            continue
    return out


def template_groups(usable: Sequence[KernelTemplate]) -> list[list[KernelTemplate]]:
    """The templates that compete under one default: each template alone, the bit-serial
    families together (module doc)."""
    family = {f.name for f in FAMILIES}
    families = [t for t in usable if t.name in family]
    return [[t] for t in usable if t.name not in family] + ([families] if families else [])


def group_default(group: Sequence[KernelTemplate], workload: Workload, arch: str | None = None
                  ) -> tuple[KernelTemplate, Config]:
    """The default of a group of `template_groups` for `arch` (None: the templates' own
    choice): `default_bitserial`'s kernel where its family is in the group, else the first
    template's default config."""
    by_name = {t.name: t for t in group}
    if by_name.keys() & {f.name for f in FAMILIES}:
        try:
            family, cfg = default_bitserial(workload, arch)
        except ValueError:  # no family fits: the first template's own default
            family, cfg = None, None
        if family is not None and family.name in by_name:
            return by_name[family.name], cfg
    return group[0], _with_arch(group[0].default_config, workload, arch)


Predictions = dict[str, tuple[list[Config], list[float]]]


def _group_predictions(group: list[KernelTemplate], workload: Workload, spec: GpuSpec, model,
                       arch: str | None, per_template: int, seed: int
                       ) -> tuple[KernelTemplate, Config, Predictions] | None:
    """The group's default (template, config) and every template's candidates with their
    predicted times (the default among its template's); None when the default cannot be
    built or has no prediction."""
    try:
        dflt_t, dflt = group_default(group, workload, arch)
    except Exception:  # a template whose space cannot be built for this target
        return None
    preds: Predictions = {}
    for t in group:
        try:
            cfgs = candidate_configs(t, workload, per_template, seed, arch=arch)
        except Exception:
            continue
        if t is dflt_t and dflt not in cfgs:
            cfgs = [dflt, *cfgs]
        preds[t.name] = (cfgs, _predicted(t, workload, cfgs, spec, model))
    if dflt_t.name not in preds:
        return None
    return dflt_t, dflt, preds


def _group_pick(group: list[KernelTemplate], workload: Workload, spec: GpuSpec, model,
                arch: str | None, per_template: int, seed: int, margin: float
                ) -> tuple[Choice, list[tuple[str, float]]] | None:
    """The group's pick (the fastest predicted candidate that is the group default or beats
    it by `margin`) and its alternatives (each template's fastest such candidate); None when
    no template of the group has candidates here."""
    found = _group_predictions(group, workload, spec, model, arch, per_template, seed)
    if found is None:
        return None
    dflt_t, dflt, preds = found
    cfgs, times = preds[dflt_t.name]
    default_us = times[cfgs.index(dflt)]
    count = sum(len(c) for c, _ in preds.values())
    picks: dict[str, tuple[Config, float]] = {}
    for name, (cfgs, times) in preds.items():
        for c, us in zip(cfgs, times, strict=True):
            if (name == dflt_t.name and c == dflt) or us <= default_us * (1 - margin):
                if name not in picks or us < picks[name][1]:
                    picks[name] = (c, us)
    name, (cfg, us) = min(picks.items(), key=lambda kv: kv[1][1])
    if name == dflt_t.name and cfg == dflt:
        pick = Choice(name, cfg, us, f"model: default config ({count} candidates within "
                                     f"{margin:.0%})")
    else:
        pick = Choice(name, cfg, us, f"model: {us:.1f} us vs default {default_us:.1f} us "
                                     f"({dflt_t.name}; {count} candidates)")
    return pick, [(t, p[1]) for t, p in picks.items()]


def choose(workload: Workload, gpu: GpuSpec | str | None = None,
           templates: Sequence[KernelTemplate] | None = None, include_fp16: bool = True,
           db: RecordsDB | str | Path | None = None, margin: float = DEFAULT_MARGIN,
           candidates: int = 48, seed: int = 0) -> Choice:
    """The predicted fastest way to run `workload` on `gpu` (default: the current GPU, else
    the H100): a recorded best when `db` has one (measured time; on `gpu` when named, else on
    any), else the model's pick of our
    templates' candidates (module doc), and TORCH_FP16 when `include_fp16` and the fp16 estimate
    beats it. ValueError when nothing can run the workload."""
    spec = gpu if isinstance(gpu, GpuSpec) else gpu_spec_for(gpu)
    arch = _target_arch(spec)
    alternatives: list[tuple[str, float]] = []
    best: Choice | None = None
    if db is not None:
        rec = best_record(workload, db, spec.name if gpu is not None else None)
        if rec is not None:
            best = Choice(rec.template, rec.cfg, float(rec.time_us),
                          f"recorded best of {rec.template} on {rec.gpu}")
            alternatives.append((rec.template, float(rec.time_us)))
    if best is None:
        model = default_model()
        for group in template_groups(_usable(workload, templates)):
            found = _group_pick(group, workload, spec, model, arch, candidates, seed, margin)
            if found is None:
                continue
            pick, group_alternatives = found
            alternatives += group_alternatives
            if best is None or pick.predicted_us < best.predicted_us:
                best = pick
    if include_fp16:
        fp16_us = float(predict_many(TORCH_FP16, workload, [{}], spec)[0])
        alternatives.append((TORCH_FP16, fp16_us))
        if best is None or fp16_us < best.predicted_us:
            why = "no template of ours supports it" if best is None else (
                f"fp16 estimate {fp16_us:.1f} us beats {best.template} {best.predicted_us:.1f} us")
            best = Choice(TORCH_FP16, None, fp16_us, why)
    if best is None:
        raise ValueError(f"no template supports {workload.key}")
    return Choice(best.template, best.config, best.predicted_us, best.reason,
                  tuple(sorted(alternatives, key=lambda a: a[1])))


def ranked_candidates(workload: Workload, gpu: GpuSpec | str | None = None,
                      templates: Sequence[KernelTemplate] | None = None, k: int = 3,
                      candidates: int = 48, seed: int = 0) -> list[Choice]:
    """The `k` candidates of `choose`'s pool (every usable template's candidate configs,
    group defaults included; no fp16) that the model predicts fastest, fastest first: what
    `choose_measured` measures."""
    spec = gpu if isinstance(gpu, GpuSpec) else gpu_spec_for(gpu)
    arch = _target_arch(spec)
    model = default_model()
    pool: list[Choice] = []
    for group in template_groups(_usable(workload, templates)):
        found = _group_predictions(group, workload, spec, model, arch, candidates, seed)
        if found is None:
            continue
        for name, (cfgs, times) in found[2].items():
            pool += [Choice(name, c, us, f"model rank: {us:.1f} us predicted")
                     for c, us in zip(cfgs, times, strict=True)]
    return sorted(pool, key=lambda c: c.predicted_us)[:max(k, 0)]


def choose_measured(workload: Workload, measure: Callable[[str, Config], float | None],
                    gpu: GpuSpec | str | None = None,
                    templates: Sequence[KernelTemplate] | None = None, k: int = 3,
                    candidates: int = 48, seed: int = 0) -> Choice:
    """Dispatch with a few measurements (the thesis's measure-a-little-then-trust idea): the
    `k` candidates the model ranks fastest (`ranked_candidates`), each timed by
    `measure(template_name, config)` (microseconds, None when it failed: a build error, a
    wrong result, a crash), and the fastest measured one; ValueError when none ran. Costs k
    builds and timings instead of a tune; the model's ranking decides which k."""
    if k < 1:
        raise ValueError(f"k must be >= 1 measurements, got {k}")
    ranked = ranked_candidates(workload, gpu, templates, k, candidates, seed)
    timed = [(c, measure(c.template, c.config)) for c in ranked]
    ok = [(c, us) for c, us in timed if us is not None]
    if not ok:
        raise ValueError(f"none of the {len(ranked)} top-ranked candidates of "
                         f"{workload.key} ran")
    best, us = min(ok, key=lambda cu: cu[1])
    return Choice(best.template, best.config, float(us),
                  f"fastest measured of the model's top {len(ranked)} ({len(ok)} ran)",
                  tuple((c.template, float(t)) for c, t in ok))


def measure_top(workload: Workload, measurer, db: RecordsDB | str | Path | None = None,
                templates: Sequence[KernelTemplate] | None = None, k: int = 3) -> Choice:
    """`choose_measured` on the GPU of `measurer` (a `lowbit.tune.Measurer`: built, checked
    bit for bit against the reference, timed in a crash-isolated worker) with every
    measurement, failures included, added to the records `db` (default: the user's records
    file), so that `kernel_for` and the engine take the fastest from then on."""
    from .measure import MeasureInput

    load_backends()
    results = []

    def measure(name: str, config: Config) -> float | None:
        res = measurer.measure([MeasureInput(get_template(name), workload, config)])[0]
        results.append(res)
        return res.time_us

    try:
        return choose_measured(workload, measure, None, templates, k)
    finally:
        records = db if isinstance(db, RecordsDB) else RecordsDB(db)
        try:
            records.add_many(Record.of(r, workload) for r in results)
        finally:
            if records is not db:
                records.close()


def outside_model_data(workload: Workload) -> str | None:
    """Why the performance model cannot rank `workload`'s configs, or None. Its measurements
    (benchmarks/results/measurements.jsonl.gz) are layers whose epilogue adds a bias, applies
    ReLU and writes one narrow output; a block end (the 32-bit epilogue with a residual read,
    or derived outputs) moves several bytes a value more, which it never saw: on ResNet-50
    b256 w1a2 its picks made the network 2.64x slower than the tuned one (H100,
    tuning_network-20261207-091920.json)."""
    epi = workload.epilogue
    if block_end_refusal(workload) is not None or epi.residual is not None:
        return (f"the performance model has no measurements of block-end epilogues "
                f"({epi.key})")
    return None


def kernel_for(workload: Workload, db: RecordsDB | str | Path | None = None,
               gpu: str | None = None, fallback: bool = True) -> Kernel:
    """The tuned kernel for `workload` from the records; without a record (and `fallback`),
    the untuned bit-serial kernel (`default_bitserial`) where a family runs the workload, else
    the template and config `choose` predicts fastest among ours (no fp16); else ValueError."""
    rec = best_record(workload, db, gpu)
    if rec is not None:
        return get_template(rec.template).build(workload, rec.cfg)
    if fallback and any(f.supports(workload) for f in FAMILIES):
        try:
            family, cfg = default_bitserial(workload)
        except ValueError:
            family = None
        if family is not None:
            return family.build(workload, cfg)
    if fallback:
        try:
            pick = choose(workload, gpu, include_fp16=False)
        except ValueError:
            pick = None
        if pick is not None and pick.config is not None:
            return get_template(pick.template).build(workload, pick.config)
    raise ValueError(f"no tuning record for {workload.key}"
                     + (f" on {gpu}" if gpu else "") + " and no fallback template")
