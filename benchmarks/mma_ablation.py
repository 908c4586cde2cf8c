"""Ablation of the tiled mma.sync conv template (Choi et al., Figures 15-16 style).

On the ResNet-50 3x3 layers at batch 256 (w8a8: s8 weights, u8 activations, bias + ReLU fused,
outputs requantized to u4 and dense-packed), per layer and in one run:
  default            the template's untuned default config
  tuned_tiles        best of a bounded sweep over the tile knobs (warps, MMA tiles, K chunk,
                     loop order), both techniques off
  register_packing   + register-level output packing (warp shuffles, no shared-memory pass)
  duplicate_aware    + duplicate-aware load (halo tile, channel-outer loop; best of the top
                     tile configs that fit)
beside the roofline floor (int8 tensor-core peak, measured copy bandwidth) and cuDNN fp16 in the
same run. Every timed config is first checked bit for bit against `lowbit.reference` on the
same random inputs; a wrong or failing config is recorded, never timed. Optionally (--s4) the
s4 m16n8k64 variant's default config on u4 x s4 packed operands, to show Hopper's emulated INT4.

Usage: python benchmarks/mma_ablation.py [--layers 0,1,2,3] [--sweep 24] [--s4]
Writes benchmarks/results/<gpu>/mma_ablation-<stamp>.json (or $LOWBIT_RESULTS_DIR).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cudnn_fp16_conv_us, gpu_name, write_results
from lowbit.core import Config, Epilogue, load_workloads
from lowbit.core.hardware import gpu_spec_for
from lowbit.core.validate import out_storage
from lowbit.kernels.cuda import nvrtc
from lowbit.kernels.cuda.mma_conv import S4_TEMPLATE, S8_TEMPLATE, render
from lowbit.kernels.timing import time_us
from lowbit.perfmodel.roofline import measure_bandwidth, workload_floor_us
from lowbit.reference import random_inputs, run

EPILOGUE = Epilogue(bias=True, relu=True, out="u4", out_layout="packed")
TILE_KNOBS = ("warps_m", "warps_n", "tiles_m", "tiles_n", "k_chunk", "loop_order")
STEPS = ("default", "tuned_tiles", "register_packing", "duplicate_aware_load")


def _compile(args: tuple[str, str]) -> str | None:
    source, arch = args
    try:
        nvrtc.compile_cubin(source, arch)
        return None
    except Exception as exc:  # the error is reported when the kernel is used
        return f"{type(exc).__name__}: {exc}"[:300]


def precompile(jobs: list[tuple[object, object, Config]], arch: str, workers: int) -> None:
    """Fill the on-disk NVRTC cache in parallel processes (NVRTC holds the GIL here)."""
    sources = list(dict.fromkeys(render(wl, cfg, t.variant) for t, wl, cfg in jobs))
    ctx = mp.get_context("spawn")  # children must not inherit this process's CUDA state
    t0 = time.time()
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        errors = [e for e in pool.map(_compile, [(s, arch) for s in sources]) if e]
    print(f"compiled {len(sources)} kernels in {time.time() - t0:.1f} s"
          f" ({len(errors)} errors)", flush=True)
    for e in errors[:3]:
        print("  ", e, flush=True)


def sweep_configs(template, wl, n: int, seed: int) -> list[Config]:
    """Default + up to n distinct tile settings (techniques off), sampled from the space."""
    space = template.space(wl)
    plain = [c for c in space if not c["duplicate_aware_load"] and not c["register_packing"]]
    rng = random.Random(seed)
    picks = [template.default_config(wl), *rng.sample(plain, min(n, len(plain)))]
    return list(dict.fromkeys(picks))


def with_techniques(template, wl, cfg: Config, dup: bool) -> Config | None:
    space = template.space(wl)
    knobs = dict(cfg, register_packing=True)
    if dup:
        knobs.update(duplicate_aware_load=True, loop_order="crs")
    cand = Config(knobs)
    return cand if space.is_valid(cand) else None


class Layer:
    """One workload's inputs, reference output and the timings of its configs."""

    def __init__(self, name: str, template, wl, seed: int) -> None:
        self.name, self.template, self.wl = name, template, wl
        self.x, self.w, self.params = random_inputs(wl, seed, device="cuda")
        self.ref = run(wl, self.x, self.w, self.params)
        shape, dtype = out_storage(wl)
        self.out = torch.empty(shape, dtype=dtype, device="cuda")
        self.results: dict[Config, dict] = {}

    def measure(self, cfg: Config) -> dict:
        if cfg in self.results:
            return self.results[cfg]
        res: dict = {"config": dict(cfg)}
        try:
            kernel = self.template.build(self.wl, cfg)
            self.out.view(torch.uint8).fill_(0xA5)  # poison: every byte must be written
            kernel(self.x, self.w, self.params, out=self.out)
            torch.cuda.synchronize()
            bad = int((self.out != self.ref).sum())
            res["verified"] = bad == 0
            if bad:
                first = (self.out != self.ref).nonzero()[0].tolist()
                res["error"] = f"{bad} of {self.ref.numel()} outputs differ, first at {first}"
            else:
                res["time_us"] = time_us(
                    lambda: kernel.launch(self.x, self.w, self.params, self.out))
        except Exception as exc:
            res["verified"] = False
            res["error"] = f"{type(exc).__name__}: {exc}"[:400]
            traceback.print_exc()
        self.results[cfg] = res
        return res

    def best(self, cfgs: list[Config]) -> tuple[Config | None, dict | None]:
        timed = [(self.measure(c)["time_us"], c) for c in cfgs if c is not None
                 and "time_us" in self.measure(c)]
        if not timed:
            return None, None
        _t, c = min(timed, key=lambda tc: tc[0])
        return c, self.results[c]


def ablation(layer: Layer, sweep: list[Config], top: int) -> dict[str, tuple[Config, dict]]:
    t, wl = layer.template, layer.wl
    steps: dict[str, tuple[Config, dict]] = {}
    default = t.default_config(wl)
    steps["default"] = (default, layer.measure(default))
    best_tiles, res = layer.best(sweep)
    if best_tiles is None:
        return steps
    steps["tuned_tiles"] = (best_tiles, res)
    packed = with_techniques(t, wl, best_tiles, dup=False)
    if packed is not None:
        steps["register_packing"] = (packed, layer.measure(packed))
    ranked = sorted((c for c in sweep if "time_us" in layer.results.get(c, {})),
                    key=lambda c: layer.results[c]["time_us"])[:top]
    dup_cands = [with_techniques(t, wl, c, dup=True) for c in ranked]
    best_dup, res = layer.best([c for c in dup_cands if c is not None])
    if best_dup is not None:
        steps["duplicate_aware_load"] = (best_dup, res)
    return steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="0,1,2,3", help="indices into resnet50_3x3_b256")
    ap.add_argument("--sweep", type=int, default=24, help="tile configs sampled per layer")
    ap.add_argument("--top", type=int, default=4, help="tile configs tried with dup-aware load")
    ap.add_argument("--s4", action="store_true", help="also time the s4 variant (default cfg)")
    ap.add_argument("--workers", type=int, default=max(1, (mp.cpu_count() or 2) - 1))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("mma_ablation needs a CUDA GPU")

    suite = load_workloads("resnet50_3x3_b256", w="s8", a="u8", epilogue=EPILOGUE)
    chosen = [suite[int(i)] for i in args.layers.split(",")]
    plan, jobs = [], []
    for i, (name, wl) in enumerate(chosen):
        sweep = sweep_configs(S8_TEMPLATE, wl, args.sweep, seed=i)
        extra = [with_techniques(S8_TEMPLATE, wl, c, dup) for c in sweep for dup in (0, 1)]
        plan.append((name, wl, sweep))
        jobs += [(S8_TEMPLATE, wl, c) for c in sweep + extra if c is not None]
        if args.s4:
            wl4 = wl.replace(w="s4", a="u4", w_layout="packed", a_layout="packed")
            jobs.append((S4_TEMPLATE, wl4, S4_TEMPLATE.default_config(wl4)))
    precompile(jobs, nvrtc.device_arch(), args.workers)

    peaks = gpu_spec_for(gpu_name())
    peaks = replace(peaks, bandwidth=measure_bandwidth())
    rows, sweeps = [], []
    for i, (name, wl, sweep) in enumerate(plan):
        t0 = time.time()
        layer = Layer(name, S8_TEMPLATE, wl, seed=10 + i)
        cudnn = cudnn_fp16_conv_us(wl)
        steps = ablation(layer, sweep, args.top)
        floor = workload_floor_us(wl, "int8", peaks)
        default_us = steps["default"][1].get("time_us")
        for step in STEPS:
            if step not in steps:
                continue
            cfg, res = steps[step]
            rows.append({"workload": name, "precision": "w8a8", "impl": S8_TEMPLATE.name,
                         "step": step, "epilogue": wl.epilogue.key, "config": dict(cfg),
                         "time_us": res.get("time_us"), "floor_us": floor,
                         "verified": res.get("verified"), "error": res.get("error"),
                         "baselines_us": {"cudnn_fp16": cudnn, "default_config": default_us}})
        sweeps.append({"workload": name, "results": list(layer.results.values())})
        if args.s4:
            wl4 = wl.replace(w="s4", a="u4", w_layout="packed", a_layout="packed")
            l4 = Layer(name, S4_TEMPLATE, wl4, seed=20 + i)
            res = l4.measure(S4_TEMPLATE.default_config(wl4))
            rows.append({"workload": name, "precision": "w4a4", "impl": S4_TEMPLATE.name,
                         "step": "default", "epilogue": wl4.epilogue.key,
                         "config": res["config"], "time_us": res.get("time_us"),
                         "floor_us": workload_floor_us(wl4, "int8", peaks),
                         "verified": res.get("verified"), "error": res.get("error"),
                         "baselines_us": {"cudnn_fp16": cudnn, "default_config": default_us}})
        print(f"{name}: {len(layer.results)} configs in {time.time() - t0:.1f} s", flush=True)
        del layer

    path = write_results("mma_ablation", rows, {"peaks": {"int8": peaks.int8,
                                                          "bandwidth": peaks.bandwidth},
                                                "sweep": sweeps})
    print(f"wrote {path}")
    print(f"{'layer':22} {'step':22} {'us':>9} {'floor':>8} {'x floor':>8} {'cudnn16':>8} "
          f"{'vs dflt':>8} {'vs cudnn':>8}")
    for r in rows:
        t = r["time_us"]
        base = r["baselines_us"]
        cells = ("-" if t is None else f"{t:9.1f}", f"{r['floor_us']:8.1f}",
                 "-" if t is None else f"{t / r['floor_us']:8.2f}", f"{base['cudnn_fp16']:8.1f}",
                 "-" if t is None or not base["default_config"]
                 else f"{base['default_config'] / t:8.2f}",
                 "-" if t is None else f"{base['cudnn_fp16'] / t:8.2f}")
        step = r["step"] + ("" if r["precision"] == "w8a8" else " (s4)")
        print(f"{r['workload']:22} {step:22} " + " ".join(cells)
              + ("" if r["verified"] else f"  FAILED {r['error']}"))


if __name__ == "__main__":
    main()
