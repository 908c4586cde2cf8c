"""int8 conv2d benchmark (issue 3): Triton int8 templates vs cuDNN fp16 and im2col + _int_mm.

Per shared conv layer (w8a8, epilogue bias + ReLU -> s8 NHWC, the output the next layer
reads): every config of a bounded slice of each int8 template that supports the layer
(`triton.conv2d_int8`, and `triton.conv2d_int8_tma` for stride 1) is built, checked bit for
bit against `lowbit.reference.run` on fresh random inputs, and timed (`lowbit.kernels.timing`,
median, L2 flushed); the fastest template's best is reported beside each template's best,
its default config, cudnn_fp16, int_mm_im2col and the roofline floor
(`lowbit.perfmodel.roofline`, bandwidth re-measured in this run). Batch-16-sized layers are
also timed as CUDA-graph replays on both sides. The TVM layer also gets the fp16 variant
(`triton.conv2d_fp16`, fp16 in and out) against cudnn_fp16. Tuned configs join the slices
from exhaustive tables (`--tables`), timed tunes (`--timed`) or a short tune (`--tune-trials`).

    python benchmarks/conv.py [--suites resnet50_3x3_b256,...] [--max-configs 40]
                              [--budget-s 300] [--tables F ...] [--timed F ...]

Writes benchmarks/results/<gpu>/conv-<stamp>.json (or into $LOWBIT_RESULTS_DIR).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from lowbit.core import Config, ConvWorkload, Epilogue, Workload, load_workloads
from lowbit.core.hardware import gpu_spec_for
from lowbit.core.validate import out_storage
from lowbit.kernels import get_template
from lowbit.kernels.timing import time_us
from lowbit.kernels.triton import (
    CONV2D_FP16,
    CONV2D_INT8,
    CONV2D_INT8_TMA,
    IgemmKernel,
    conv2d_fp16,
)
from lowbit.kernels.triton.igemm import cdiv, reduction_steps
from lowbit.kernels.triton.tma_conv import padded_rows
from lowbit.perfmodel.roofline import measure_bandwidth, workload_floor_us
from lowbit.reference import random_inputs, run

CONV_SUITES = ("resnet50_3x3_b256", "resnet50_3x3_b16", "tvm_tutorial", "resnet50_1x1",
               "resnet18_b8", "apconv_sweep")
EPILOGUE = Epilogue(bias=True, relu=True, out="s8")
WARMUP_MS, REP_MS = 10, 40
PREFERRED_TILES = {(128, 256, 128, 8), (256, 128, 128, 8), (128, 128, 128, 8), (128, 64, 64, 4),
                   (128, 128, 64, 8)}


# ------------------------------------------------------------------ configs and compiling

def bench_configs(template, wl: Workload, max_configs: int, seed: int = 0) -> list[Config]:
    """The bounded slice that is searched exhaustively: GROUP_M 8 (when valid), loop order
    rsc, 3 or 4 stages; every tile / warp / split-K choice. Sampled down to max_configs
    (fixed seed) if larger; the default config always included; then up to max_configs / 2
    LOOP_ORDER "r_sc" twins where the layer allows them (C < BLOCK_K)."""
    space = template.space(wl)
    default = template.default_config(wl)
    group_ok = any(c["GROUP_M"] == 8 for c in space)
    pts = [c for c in space if c.get("LOOP_ORDER", "rsc") == "rsc" and c["num_stages"] in (3, 4)
           and c["GROUP_M"] == (8 if group_ok else 1)]
    # big-tile shapes known to run well for Triton matmuls on Hopper stay in any sample
    keep = [c for c in pts if (c["BLOCK_M"], c["BLOCK_N"], c["BLOCK_K"], c["num_warps"])
            in PREFERRED_TILES and c.get("SPLIT_K", 1) == 1]
    rest = [c for c in pts if c not in keep and c != default]
    room = max(0, max_configs - 1 - len(keep))
    if len(rest) > room:
        rest = random.Random(seed).sample(rest, room)
    picked = [default, *[c for c in keep if c != default], *rest]
    # small-C layers: the same tiles with a kernel row's taps packed along the reduction
    twins = [t for t in (c.replace(LOOP_ORDER="r_sc") for c in picked if "LOOP_ORDER" in c)
             if space.is_valid(t)]
    return picked + twins[: max_configs // 2]


def int8_wgmma_configs(wl: ConvWorkload, max_configs: int, seed: int = 0) -> list[Config]:
    """`cuda.int8_wgmma` (sm_90a GPUs only, else none): default first, then sampled points
    with at least 128 x 64 tiles."""
    from lowbit.kernels.cuda import INT8_WGMMA, WGMMA_ARCH, target_arch

    if target_arch() != WGMMA_ARCH or not INT8_WGMMA.supports(wl):
        return []
    space = INT8_WGMMA.space(wl)
    default = INT8_WGMMA.default_config(wl)
    rest = [c for c in space if c != default and c["BM"] * c["BN"] >= 128 * 64]
    n = max(0, max_configs - 1)
    return [default, *random.Random(seed).sample(rest, min(len(rest), n))]


def tma_configs(wl: ConvWorkload, max_configs: int, seed: int = 0) -> list[Config]:
    """The bounded slice of `triton.conv2d_int8_tma`: default first, then sampled points with
    (near) the least row padding, BLOCK_K >= 64 where C allows, 3-4 stages, tiles of >= 128 x
    64, either loop order and group size (the tuned winners of 2026-11-23 used crs and
    GROUP_M 1, which an earlier rsc / GROUP_M 8 filter left out)."""
    space = CONV2D_INT8_TMA.space(wl)
    default = CONV2D_INT8_TMA.default_config(wl)
    pts = list(space)
    least = min(padded_rows(wl, c) for c in pts)

    def good(c: Config) -> bool:
        return (padded_rows(wl, c) <= 1.05 * least and c["num_stages"] in (3, 4)
                and (c["BLOCK_K"] >= 64 or wl.C < 64)
                and c["BLOCK_N"] * c["BLOCK_I"] * c["BLOCK_P"] * c["BLOCK_Q"] >= 128 * 64)

    rest = [c for c in pts if good(c) and c != default]
    rest = random.Random(seed).sample(rest, min(len(rest), max_configs - 1))
    return [default, *rest]


def _compile_one(template_name: str, wl_json: str, cfg_json: str) -> str | None:
    from lowbit.core import workload_from_json
    from lowbit.kernels import load_backends

    load_backends()  # registers the Triton and CUDA templates in this pool process

    try:
        kernel = get_template(template_name).build(workload_from_json(wl_json),
                                                   Config.from_json(cfg_json))
        if hasattr(kernel, "compile"):  # Triton: compile ahead; CUDA: `build` compiled it
            kernel.compile()
    except Exception as e:  # recorded, the timing pass reports it again
        return f"{type(e).__name__}: {e}"[:300]
    return None


def _compile_key(kernel) -> tuple:
    """What Triton specializes on: constexprs (config, problem flags) and, per integer
    argument, ==1 and %16 (two configs with equal keys share one compiled binary)."""
    if not isinstance(kernel, IgemmKernel):  # other kernels: one binary per (workload, config)
        return (kernel.template, kernel.workload.key, kernel.config)
    p, cfg = kernel.problem, kernel.config
    iters = reduction_steps(p.R, p.S, p.C, cfg["BLOCK_K"], cfg.get("LOOP_ORDER") == "r_sc")
    ints = (p.M, p.NOUT, p.H, p.W, p.C, p.P, p.Q, p.stride, p.pad, p.x_row, p.w_row, p.out_row,
            p.out_plane, cdiv(iters, cfg["SPLIT_K"]))
    flags = tuple((v == 1, v % 16 == 0) for v in ints)
    return (kernel.template, kernel.config, p.R, p.S, p.is_gemm, p.a_operand, p.w_operand,
            p.dot_fp16, p.bias, p.relu, p.out, p.C % kernel.config["BLOCK_K"] == 0, flags)


def precompile(jobs: list[tuple], workers: int = 16) -> dict[tuple, str | None]:
    """Compile (template, workload, config) jobs in parallel, one per distinct binary."""
    unique: dict[tuple, tuple] = {}
    for t, wl, cfg in jobs:
        # CUDA templates compile in `build` (NVRTC): key them without building here
        key = _compile_key(t.build(wl, cfg)) if t.backend == "triton" else (t.name, wl.key, cfg)
        unique.setdefault(key, (t.name, wl.to_json(), cfg.to_json()))
    t0 = time.perf_counter()
    try:
        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            errs = list(pool.map(_compile_one, *zip(*unique.values(), strict=True)))
    except Exception as e:  # the timing pass then compiles serially
        print(f"precompile failed ({type(e).__name__}: {e}); compiling serially", flush=True)
        return {}
    print(f"precompiled {len(unique)} binaries for {len(jobs)} (layer, config) pairs in "
          f"{time.perf_counter() - t0:.0f} s, {sum(e is not None for e in errs)} failed",
          flush=True)
    return dict(zip(unique, errs, strict=True))


# ------------------------------------------------------------------ measuring

def poisoned_out(wl: Workload) -> torch.Tensor:
    shape, dtype = out_storage(wl)
    return torch.full(shape, 77, dtype=dtype, device="cuda")


def sweep_table(template, wl: Workload, configs: list[Config], seed: int = 0
                ) -> list[tuple[Config, float | None, str | None]]:
    """(config, median us or None, error or None) for every config: each one is checked bit
    for bit against the reference on fresh random inputs (poisoned output) before timing."""
    x, w, params = random_inputs(wl, seed, device="cuda")
    ref = run(wl, x, w, params)
    results = []
    for cfg in configs:
        try:
            kernel = template.build(wl, cfg)
            out = poisoned_out(wl)
            launch = kernel.bind(x, w, params, out)
            launch()
            torch.cuda.synchronize()
            if not torch.equal(out, ref):
                results.append((cfg, None, f"wrong: {(out != ref).sum().item()} differ"))
                continue
            us = time_us(launch, warmup_ms=WARMUP_MS, rep_ms=REP_MS)
            results.append((cfg, us, None))
        except Exception as e:
            results.append((cfg, None, f"{type(e).__name__}: {str(e)[:200]}"))
    return results


def sweep(template, wl: Workload, configs: list[Config], graph: bool = False,
          seed: int = 0) -> dict:
    """Verify and time every config; returns {'best': (cfg, us), 'default_us', ...}."""
    results = sweep_table(template, wl, configs, seed)
    ok = [(c, us) for c, us, err in results if err is None]
    if not ok:
        raise RuntimeError(f"no config of {template.name} ran correctly on {wl.key}: "
                           f"{results[0][2]}")
    best_cfg, best_us = min(ok, key=lambda r: r[1])
    default_us = results[0][1]  # configs[0] is the default config
    doc = {"best": (best_cfg, best_us), "default_us": default_us,
           "failed": [(dict(c), err) for c, _, err in results if err is not None],
           "timed": len(ok)}
    doc["compiled"] = compiled_info(template.build(wl, best_cfg))
    if graph:
        x, w, params = random_inputs(wl, seed, device="cuda")
        kernel = template.build(wl, best_cfg)
        doc["best_graph_us"] = time_us(kernel.bind(x, w, params, poisoned_out(wl)),
                                       cuda_graph=True)
        dk = template.build(wl, configs[0])
        doc["default_graph_us"] = time_us(dk.bind(x, w, params, poisoned_out(wl)),
                                          cuda_graph=True)
    return doc


def compiled_info(kernel) -> dict:
    """Registers, spills, shared memory and whether the PTX uses wgmma (Hopper MMA); Triton
    kernels only (CUDA ones: {})."""
    if not hasattr(kernel, "compile"):
        return {}
    try:
        ck = kernel.compile()
        ck._init_handles()  # loads the binary: fills n_regs / n_spills
        return {"n_regs": ck.n_regs, "n_spills": ck.n_spills,
                "shared": ck.metadata.shared, "wgmma": "wgmma" in ck.asm.get("ptx", "")}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {str(e)[:120]}"}


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:8.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a / b:5.2f}"


def fp16_row(name: str, wl: ConvWorkload, peaks, max_configs: int) -> dict:
    """triton.conv2d_fp16 (fp16 data) vs cudnn_fp16 on one layer."""
    torch.backends.cudnn.allow_tf32 = False  # the fp32 reference must not be tf32
    x = torch.randn(wl.N, wl.H, wl.W, wl.C, device="cuda").half()
    w = torch.randn(wl.K, wl.R, wl.S, wl.C, device="cuda").half()
    ref = torch.nn.functional.conv2d(x.float().permute(0, 3, 1, 2),
                                     w.float().permute(0, 3, 1, 2), stride=wl.stride,
                                     padding=wl.pad).permute(0, 2, 3, 1)
    space_wl = wl.replace(a="s4", w="s4")  # any integer precision: only the space is used
    configs = bench_configs(CONV2D_FP16, space_wl, max_configs)
    best = None
    default_us = None
    for i, cfg in enumerate(configs):
        try:
            out = conv2d_fp16(x, w, wl.stride, wl.pad, cfg)
            rel = float((out.float() - ref).norm() / ref.norm())
            if rel > 2e-3:
                continue
            us = time_us(lambda c=cfg: conv2d_fp16(x, w, wl.stride, wl.pad, c),
                         warmup_ms=WARMUP_MS, rep_ms=REP_MS)
        except Exception as e:
            print(f"  fp16 config {dict(cfg)} failed: {type(e).__name__}: {str(e)[:120]}")
            continue
        if i == 0:
            default_us = us
        if best is None or us < best[1]:
            best = (cfg, us)
    cudnn = common.cudnn_fp16_conv_us(wl)
    return {"workload": name, "precision": "fp16", "impl": "triton.conv2d_fp16",
            "config": dict(best[0]) if best else None, "time_us": best[1] if best else None,
            "floor_us": workload_floor_us(wl, "fp16", peaks),
            "baselines_us": {"cudnn_fp16": cudnn, "default_config": default_us},
            "configs_timed": len(configs)}


class ResultsFile:
    """One results file per run (the format of docs/design.md, section 5), rewritten after
    every layer so a run cut short still leaves its finished rows."""

    def __init__(self, benchmark: str, extra: dict):
        import datetime as dt
        import json

        self._json = json
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.path = common.results_dir() / f"{benchmark}-{stamp}.json"
        self.doc = {"benchmark": benchmark, "gpu": common.gpu_name(),
                    "date": dt.date.today().isoformat(), "versions": common.versions(),
                    **extra, "rows": []}

    def add(self, row: dict) -> None:
        self.doc["rows"].append(row)
        self.path.write_text(self._json.dumps(self.doc, indent=1))


def layer_row(name: str, wl: ConvWorkload, sweeps: list[tuple], peaks) -> dict:
    """One results row: every (template, configs) slice verified and timed; the fastest
    template's best is ours, each template's best is kept beside the baselines."""
    small = wl.N <= 16 or wl.gemm_shape[0] <= 16 * 56 * 56
    res, errors = {}, {}
    for t, cfgs in sweeps:
        try:
            if cfgs:
                res[t.name] = sweep(t, wl, cfgs, graph=small)
        except Exception as e:  # one template failing leaves the others' row standing
            errors[t.name] = f"{type(e).__name__}: {str(e)[:300]}"
    if not res:
        raise RuntimeError(f"every template failed: {errors}")
    impl = min(res, key=lambda k: res[k]["best"][1])
    best = res[impl]
    cfg, us = best["best"]
    base = {"cudnn_fp16": common.cudnn_fp16_conv_us(wl),
            "int_mm_im2col": common.int_mm_im2col_us(wl),
            "default_config": best["default_us"],
            **{k: r["best"][1] for k, r in res.items()}}
    row = {"workload": name, "precision": "w8a8", "impl": impl, "epilogue": EPILOGUE.key,
           "config": dict(cfg), "time_us": us,
           "floor_us": workload_floor_us(wl, "int8", peaks), "baselines_us": base,
           "configs_timed": {k: r["timed"] for k, r in res.items()},
           "configs_failed": [f for r in res.values() for f in r["failed"]][:5],
           "compiled": best["compiled"], "template_errors": errors}
    if small:
        row["cuda_graph_us"] = {
            "triton": best["best_graph_us"], "default_config": best["default_graph_us"],
            "cudnn_fp16": common.cudnn_fp16_conv_us(wl, cuda_graph=True),
            "int_mm_im2col": common.int_mm_im2col_us(wl, cuda_graph=True),
            **{k: r["best_graph_us"] for k, r in res.items()}}
    return row


def _print_row(row: dict) -> None:
    us, base, g = row["time_us"], row["baselines_us"], row.get("cuda_graph_us", {})
    print(f"{row['workload']:32s} {row['impl']:24s} best {_fmt(us)} us  floor "
          f"x{_ratio(us, row['floor_us'])}  cudnn/ours {_ratio(base['cudnn_fp16'], us)}  "
          f"im2col/ours {_ratio(base['int_mm_im2col'], us)}  default/ours "
          f"{_ratio(base['default_config'], us)}  graph cudnn/ours "
          f"{_ratio(g.get('cudnn_fp16'), g.get('triton'))}  n={row['configs_timed']}",
          flush=True)


def _with_tuned(wl: Workload, cfgs: list[Config], args) -> list[Config]:
    """The slice plus the tuner's best configs (from tables, else a short tune)."""
    extra = common.table_configs(args.tables, wl)
    if not extra and args.tune_trials:
        records = common.results_dir() / "conv_records.db"
        extra = common.tuned_configs(CONV2D_INT8, wl, args.tune_trials, records)
    head = cfgs[:1] + [c for c in extra if c != cfgs[0]]  # configs[0] stays the default
    return head + [c for c in cfgs[1:] if c not in head]


def timed_bests(files: list[Path]) -> dict[tuple[str, str], list[Config]]:
    """(layer name, template name) -> the best configs found before: each template's best in
    timed-*.json files (tuning.py; older files name only the winner's) and the winning config
    of each row of earlier conv-*.json results, as today's templates know them
    (`migrate_config`; a config no kernel of today has is left out)."""
    import json

    from lowbit.kernels.cuda import migrate_config

    out: dict[tuple[str, str], list[Config]] = {}

    def add(layer: str, template: str, cfg: dict) -> None:
        try:
            template, config = migrate_config(template, cfg)
        except (ValueError, KeyError):
            return
        cfgs = out.setdefault((layer, template), [])
        if config not in cfgs:
            cfgs.append(config)

    for f in files:
        doc = json.loads(f.read_text())
        for r in doc["rows"]:
            if doc.get("benchmark") == "conv":
                if r.get("config"):
                    add(r["workload"], r["impl"], r["config"])
                continue
            if r.get("best_template"):
                add(r["workload"], r["best_template"], r["best_config"])
            for t, cfg in r.get("best_config_by_template", {}).items():
                add(r["workload"], t, cfg)
    return out


def _with_timed(cfgs: list[Config], tuned: list[Config]) -> list[Config]:
    """cfgs with the tuned configs placed right after the default (configs[0] stays it)."""
    tuned = [c for c in tuned if c not in cfgs[:1]]
    return cfgs[:1] + tuned + [c for c in cfgs[1:] if c not in tuned] if cfgs else []


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suites", default=",".join(CONV_SUITES))
    ap.add_argument("--max-configs", type=int, default=40)
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="after this, remaining layers get only 8 configs")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--tables", type=Path, nargs="*", default=[],
                    help="exhaustive tuning tables: their 6 best configs per layer join the sweep")
    ap.add_argument("--timed", type=Path, nargs="*", default=[],
                    help="timed-*.json of benchmarks/tuning.py and earlier conv-*.json results: "
                         "each layer's best configs join their template's sweep")
    ap.add_argument("--tune-trials", type=int, default=0,
                    help="layers without tables: add the 6 best of a lowbit.tune of N trials")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmarks/conv.py needs a CUDA GPU")
    t_start = time.perf_counter()
    peaks = replace(gpu_spec_for(common.gpu_name()), bandwidth=measure_bandwidth())
    layers = [(n, wl) for s in args.suites.split(",") for n, wl in
              load_workloads(s, epilogue=EPILOGUE)]
    from lowbit.kernels.cuda import INT8_WGMMA

    timed = timed_bests(args.timed)

    def sweeps(n: str, wl: ConvWorkload) -> list[tuple]:
        """(template, configs) per int8 template: its slice with the tuned bests after the
        default (the first config)."""
        slices = [(CONV2D_INT8, _with_tuned(wl, bench_configs(CONV2D_INT8, wl,
                                                                args.max_configs), args)),
                  (CONV2D_INT8_TMA, tma_configs(wl, args.max_configs)
                   if CONV2D_INT8_TMA.supports(wl) else []),
                  (INT8_WGMMA, int8_wgmma_configs(wl, args.max_configs // 2))]
        return [(t, _with_timed(cfgs, timed.get((n, t.name), []))) for t, cfgs in slices]

    plan = [(n, wl, sweeps(n, wl)) for n, wl in layers]
    precompile([(t, wl, c) for _, wl, sw in plan for t, cs in sw for c in cs], args.workers)
    results = ResultsFile("conv", {"peaks": peaks.peaks(), "epilogue": EPILOGUE.key})
    for name, wl, sw in plan:
        if time.perf_counter() - t_start > args.budget_s:
            sw = [(t, cs[:8]) for t, cs in sw]
        try:
            row = layer_row(name, wl, sw, peaks)
        except Exception as e:
            print(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        results.add(row)
        _print_row(row)
    for name, wl in load_workloads("tvm_tutorial"):
        if "tvm_tutorial" in args.suites:
            r = fp16_row(name, wl, peaks, max_configs=6)
            results.add(r)
            print(f"{name:32s} fp16 {_fmt(r['time_us'])} us  cudnn/ours "
                  f"{_ratio(r['baselines_us']['cudnn_fp16'], r['time_us'])}", flush=True)
    print(f"wrote {results.path} in {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
