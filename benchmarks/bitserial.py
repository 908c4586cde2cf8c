"""Bit-serial (APNN-TC) conv2d and GEMM on b1 AND tensor cores vs our int8 path and cuDNN fp16.

For the shared conv and GEMM workloads at w1a1, w1a2, w2a2, w1a4, w2a4, w3a3 (weights: b1 for
1 bit, signed otherwise; activations: b1 for w1a1, unsigned otherwise), with the fused epilogue
bias + ReLU + requantize to u<a_bits> bit planes (the next layer's input). Every bit-serial
kernel is verified bit for bit against `lowbit.reference.run` (on the GPU, float64-exact) before
it is timed. Baselines in the same run: `int8_best` (our Triton int8 template, w8a8, best of a
few configs), `int_mm_im2col` / `int_mm` (cuBLASLt int8), `cudnn_fp16` (conv) / `fp16_matmul`.
Timing: CUDA-graph replays (`lowbit.kernels.timing.time_us`), median. Floors:
`lowbit.perfmodel.roofline.workload_floor_us(wl, "bitserial")` with the measured bandwidth.

Configs are handled as kernel parameters (`lowbit.kernels.cuda.kernel_spec`: every family's
knobs) and built by their family's template; rows name the fastest one's template (`impl`) and
config, tries their own. Earlier results (of any template, the single "cuda.bitserial" of
before the split included) are read through `migrate_config`.

With --tune-trials N each bit-serial row first runs `lowbit.tune` over the bit-serial families
(N verified trials, records in $LOWBIT_RESULTS_DIR/bitserial_tune.sqlite) and its best config
joins the row's candidates; --int8-timed adds the tuned int8 configs of benchmarks/tuning.py's
timed-*.json files (either int8 template) to `int8_best`.

Usage: python benchmarks/bitserial.py [--budget-s 300] [--quick] [--layers a,b]
           [--tune-trials 200 --tune-budget-s 90] [--int8-timed timed-*.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from lowbit.core import (
    Config,
    ConvWorkload,
    Epilogue,
    GemmWorkload,
    Layout,
    Precision,
    Workload,
    parse_wa,
)
from lowbit.core.hardware import gpu_spec_for
from lowbit.core.validate import operand_shapes
from lowbit.core.workloads import load_workloads
from lowbit.kernels.cuda import (
    FAMILIES,
    LEGACY,
    MMA_SYNC,
    WGMMA,
    default_bitserial,
    family_of,
    kernel_spec,
    migrate_config,
)
from lowbit.kernels.cuda import bitserial_family as family_mod
from lowbit.kernels.cuda import bitserial_layout as layout
from lowbit.kernels.cuda.bitserial_shape import conv_shape, needs_wtap
from lowbit.kernels.timing import time_us
from lowbit.perfmodel.roofline import measure_bandwidth, workload_floor_us
from lowbit.quant.packing import pack
from lowbit.reference import run
from lowbit.reference.ops import random_params

PRECISIONS = ("w1a1", "w1a2", "w2a2", "w1a4", "w2a4", "w3a3")
BP = Layout.BITPLANE
# Published APNN-TC kernels built for sm_90a on an H100 (issue 6): fixed shapes, raw int32 out.
APNN_TC_US = {("gemm_4096", "w1a2"): 563.0, ("gemm_4096", "w1a1"): 283.0,
              ("gemm_4096", "w2a2"): 1113.0, ("apconv_b1_c1024", "w1a2"): 17.0}
TARGETS = {"apnn_tc_speedup": 5.0, "w1a1_vs_int8_conv_b256": 4.0,
           "w1a2_vs_int8_conv_b256": 2.5, "w1a2_vs_cudnn_fp16_b256": 4.0,
           "w1a2_gemm_vs_int_mm": 1.0}
SMS, CLOCK_HZ = 132, 1.755e9
MMA_CYCLES = 65536 * SMS * CLOCK_HZ / 10_279e12  # SM cycles per m16n8k256 at the measured peak
TILE_LATENCY_CYCLES = 3000  # load -> mma -> store of one tile when nothing hides it
L2_BYTES_PER_CYCLE = 64  # per SM, L2 -> shared memory
BARRIER_CYCLES = 400  # wait for a stage + __syncthreads + first fragment loads


def specs_of(wl: Workload) -> list[Config]:
    """Every config of the bit-serial families this GPU runs, as kernel parameters."""
    return [f.spec(c) for f in FAMILIES if f.supports(wl) for c in f.space(wl)]


def valid(wl: Workload, spec: Config) -> bool:
    """Whether kernel parameters are a config of a family's space on this GPU."""
    try:
        family = family_of(spec)
    except ValueError:
        return False
    return family.supports(wl) and family.space(wl).is_valid(family.config_of(spec))


def build(wl: Workload, spec: Config):
    family = family_of(spec)
    return family.build(wl, family.config_of(spec))


def kind_default(wl: Workload, mma: str) -> Config:
    """The default kernel parameters of an MMA kind: `default_bitserial` for wgmma (sm_90a),
    the mma.sync one-tile family's default for mma.sync."""
    if mma == "wgmma":
        family, cfg = default_bitserial(wl)
        return family.spec(cfg)
    return MMA_SYNC.spec(MMA_SYNC.default_config(wl))


def plain_spec(wl: Workload, mma: str = "wgmma") -> Config:
    """The plain default (no regime defaults) of an MMA kind's one-tile family."""
    family = WGMMA if mma == "wgmma" else MMA_SYNC
    return family.spec(family.default_config(wl, plain=True))


def tried_spec(row: dict, tried: dict) -> Config:
    """The kernel parameters of a result row's try (rows before the split: "cuda.bitserial")."""
    return kernel_spec(tried.get("template", row.get("impl", LEGACY)), tried["config"])


def estimate_us(wl: Workload, c: Config) -> float:
    """Rough time of a config (ranks candidates only; the measurement decides): tensor-core vs
    shared-memory cycles per tile, resident blocks per SM, and exposed latency per wave unless
    the kernel is persistent."""
    sh = conv_shape(wl)
    p, q = wl.w.bits, wl.a.bits
    wm, wn = c["BM"] // c["WM"], c["BN"] // c["WN"]
    ktiles = layout.k_tiles(wl, c)
    ksteps = ktiles * c["KT"]
    mma = (c["BM"] // 16) * (c["BN"] // 8) * p * q * ksteps
    if wl.w.encoding.value == "binary":
        mma += (c["BM"] // 16) * q * wn * ksteps
    if c["MMA"] == "wgmma":  # each warpgroup's wgmma reads its A rows and B planes once
        smem_bytes = (q * 64 + p * c["WN"]) * 32 * ksteps * wm * wn
    else:
        smem_bytes = (q * c["BM"] * wn + p * c["BN"] * wm) * 32 * ksteps
    l2_bytes = (q * c["BM"] + p * c["BN"]) * 32 * ksteps  # operand tiles streamed per tile
    cycles = max(mma * MMA_CYCLES, smem_bytes / 128, l2_bytes / L2_BYTES_PER_CYCLE)
    threads = layout.threads(c)
    regs = layout.acc_regs(wl, c) + family_mod.OTHER_REGS
    per_sm = max(1, min(65536 // (threads * regs), (227 * 1024) // layout.smem_bytes(wl, c),
                        2048 // threads))
    tiles = -(-sh.rows // c["BM"]) * -(-sh.kout // c["BN"])
    waves = -(-tiles // (SMS * per_sm))
    barriers = tiles * ktiles * BARRIER_CYCLES / per_sm  # a stall per stage, others fill it
    busy = (tiles * cycles + barriers) / SMS
    exposed = 0 if c["PERSIST"] else waves * TILE_LATENCY_CYCLES
    return (busy + exposed) / CLOCK_HZ * 1e6


OTHER_REQUANT = {"threshold": "multiply", "multiply": "threshold"}


def candidates(wl: Workload, n: int, persist: bool = True) -> list[Config]:
    """The mma.sync default config, then the best-ranked others with distinct tile shapes
    (n in all); on sm_90a also the wgmma default and its n - 1 best-ranked others; then twins
    of the defaults (HALO=1; wgmma: other KT/STAGES pairs and persistent blocks; binary
    weights: ROWSUM="table"; 1-2 bit outputs: the other REQUANT mode of every chosen; grids of
    few tiles: every chosen one at each SPLIT_K > 1) where valid."""
    space = specs_of(wl)
    chosen: list[Config] = []
    for mma in sorted({c["MMA"] for c in space}):  # mma_sync first
        default = kind_default(wl, mma)
        picked, shapes = [default], {(default["BM"], default["BN"], default["WM"], default["WN"])}
        ranked = [c for c in space if c["MMA"] == mma and c["SWIZZLE"] == default["SWIZZLE"]
                  and not c["HALO"] and c["ROWSUM"] == "mma"
                  and (not c["PERSIST"] or (persist and mma == "mma_sync"))]
        for c in sorted(ranked, key=lambda c: estimate_us(wl, c)):
            shape = (c["BM"], c["BN"], c["WM"], c["WN"])
            if len(picked) >= n:
                break
            if shape not in shapes:
                picked.append(c)
                shapes.add(shape)
        chosen += picked
    # twins of the defaults: duplicate-aware load, and for wgmma the (KT, STAGES) pairs that won
    # on H100 (docs/history/bitserial.md, session 11-22 v4: the estimate above does not model
    # the wgmma pipeline)
    twins = [chosen[0].replace(PERSIST=0, HALO=1)]
    for c in [c for c in chosen if c["MMA"] == "wgmma"][:1]:
        twins += [c.replace(HALO=1), c.replace(KT=2, STAGES=4), c.replace(KT=2, STAGES=4, HALO=1),
                  c.replace(KT=1, STAGES=6), c.replace(KT=1, STAGES=6, HALO=1)]
    defaults = [c for c in chosen if c == kind_default(wl, c["MMA"])]
    if any(c["ROWSUM"] == "table" for c in space):  # binary weights: row sums from the table
        twins += [c.replace(ROWSUM="table") for c in defaults]
    if any(c["REQUANT"] == "threshold" for c in space):  # 1-2 bit planes out: both modes
        twins += [c.replace(REQUANT=OTHER_REQUANT[c["REQUANT"]]) for c in chosen]
    if persist:  # persistent wgmma blocks: the first valid one, and at 6 stages (H100,
        # 2026-11-24: the best GEMM 4096 w1a2 config, 56.6 us against 61.4 one tile per block)
        wgmma = [c for c in chosen if c["MMA"] == "wgmma"]
        twins += [t for t in (c.replace(PERSIST=1) for c in wgmma) if valid(wl, t)][:1]
        twins += [t for t in (c.replace(PERSIST=1, KT=1, STAGES=6) for c in wgmma)
                  if valid(wl, t)][:1]
    twins += shift_candidates(wl, space)
    # split-K (the mma.sync one-tile family's, grids of few tiles only)
    splits = [v for v in MMA_SYNC.space(wl).knob("SPLIT_K").values if v > 1]
    twins += [c.replace(PERSIST=0, SPLIT_K=v) for c in chosen for v in splits]
    return chosen + [t for t in dict.fromkeys(twins) if valid(wl, t) and t not in chosen]


def shift_candidates(wl: Workload, space: list[Config]) -> list[Config]:
    """One TAP_SHIFT=1 config per block tile shape (BM, BN, WN), PERSIST and STAGES (32-byte
    swizzled B, row sums by MMA, rows from the table: ROW_TABLE=1, REQUANT "threshold" where
    offered), each followed by its ROWSUM="slab" twin where valid: the estimate above does not
    model the tap-shift kernels, so every shape is timed."""
    shifted = [c for c in space if c["TAP_SHIFT"] and c["SWIZZLE"] == 32
               and c["ROWSUM"] == "mma" and c["ROW_TABLE"] == 1]
    requant = "threshold" if any(c["REQUANT"] == "threshold" for c in shifted) else "multiply"
    shapes = {(c["BM"], c["BN"], c["WN"], c["PERSIST"], c["STAGES"]): c for c in shifted
              if c["REQUANT"] == requant}
    twins = [(c, c.replace(ROWSUM="slab")) for c in shapes.values()]
    return [t for pair in twins for t in pair if valid(wl, t)]


def precisions(name: str) -> tuple[Precision, Precision]:
    wb, ab = parse_wa(name)
    w = Precision(1, "binary") if wb == 1 else Precision(wb, "signed")
    a = Precision(1, "binary") if ab == 1 else Precision(ab)
    return w, a


def bitserial_workload(base: Workload, name: str) -> Workload:
    w, a = precisions(name)
    epi = Epilogue(bias=True, relu=True, out=Precision(a.bits), out_layout=BP)
    return base.replace(w=w, a=a, w_layout=BP, a_layout=BP, epilogue=epi)


def int8_workload(base: Workload) -> Workload:
    epi = Epilogue(bias=True, relu=True, out=Precision(8, "signed"), out_layout=Layout.INT8)
    s8 = Precision(8, "signed")
    return base.replace(w=s8, a=s8, w_layout=Layout.INT8, a_layout=Layout.INT8, epilogue=epi)


def workloads(quick: bool) -> list[tuple[str, Workload]]:
    out: list[tuple[str, Workload]] = [("gemm_4096", GemmWorkload(M=4096, N=4096, K=4096)),
                                       ("apconv_b1_c1024", ConvWorkload(N=1, H=16, W=16, C=1024,
                                                                        K=1024, R=3, S=3,
                                                                        pad=1))]
    out[1:1] = load_workloads("resnet50_3x3_b256")
    out += sorted(load_workloads("gemm"), key=lambda nw: nw[1].ops)  # the 8192^3 GEMM last
    return out[:3] if quick else out


def gpu_inputs(wl: Workload, seed: int):
    """Random storage-layout inputs made on the GPU (the CPU is too slow for batch 256)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    xs, ws, _ = operand_shapes(wl)

    def values(shape, prec):
        if prec.encoding.value == "binary":
            return torch.randint(0, 2, shape, generator=g, device="cuda") * 2 - 1
        return torch.randint(prec.qmin, prec.qmax + 1, shape, generator=g, device="cuda")

    x = pack(values(xs, wl.a), wl.a, wl.a_layout)
    w = pack(values(ws, wl.w), wl.w, wl.w_layout)
    params = random_params(wl, torch.Generator().manual_seed(seed)).to("cuda")
    return x, w, params


def timed(fn) -> float:
    try:
        return time_us(fn, cuda_graph=True)
    except Exception:  # a launcher that cannot be captured is timed plainly
        torch.cuda.synchronize()
        return time_us(fn)


def bitserial_row(wl: Workload, seed: int, tries: int, persist: bool,
                  extra: list[Config] = (), focus: bool = False) -> dict:
    """Best verified config among the default, up to `tries - 1` alternatives and `extra`
    (e.g. a tuned config) (per MMA kind: `best_us_by_mma` has the best time of each); focus:
    the default and `extra` only. Binary activations: also the per-layer weight table's fill
    time (`bind_tables_us`, done once at bind) and the best config timed with that fill in
    every launch, as launches did before (`with_tables_us`)."""
    from conv import precompile

    x, w, params = gpu_inputs(wl, seed)
    want = run(wl, x, w, params)
    configs = [kind_default(wl, "wgmma" if WGMMA.supports(wl) else "mma_sync")] if focus \
        else candidates(wl, tries, persist)
    configs += [c for c in extra if c not in configs]
    # NVRTC's disk cache, in parallel
    precompile([(family_of(c), wl, family_of(c).config_of(c)) for c in configs])
    best: dict = {}
    for cfg in configs:
        family = family_of(cfg)
        kernel = build(wl, cfg)
        out = torch.empty_like(want)
        out.view(torch.uint8).fill_(0xA5)
        launcher = kernel.bind(x, w, params, out)
        launcher()
        torch.cuda.synchronize()
        exact = bool(torch.equal(out, want))
        us = timed(launcher) if exact else float("nan")
        if cfg == configs[0]:
            best["default_config_us"] = us
        best.setdefault("tried", []).append({"template": family.name,
                                             "config": dict(family.config_of(cfg)), "us": us,
                                             "exact": exact})
        if not exact:
            best.setdefault("errors", []).append(f"{cfg.to_json()} NOT bit-exact")
            continue
        by_mma = best.setdefault("best_us_by_mma", {})
        by_mma[cfg["MMA"]] = min(us, by_mma.get(cfg["MMA"], us))
        if "time_us" not in best or us < best["time_us"]:
            best.update(time_us=us, impl=family.name, config=dict(family.config_of(cfg)))
    best["verified"] = "time_us" in best
    if best["verified"] and needs_wtap(wl):
        launcher = build(wl, kernel_spec(best["impl"], best["config"])).bind(x, w, params)
        best["bind_tables_us"] = timed(launcher.refresh_tables)
        best["with_tables_us"] = timed(lambda: (launcher.refresh_tables(), launcher()))
    return best


def int8_best_us(base: Workload, tries: int, tuned: list[tuple[str, Config]] = ()
                 ) -> tuple[float | None, dict | None]:
    """Fastest of our int8 template's default, `tries - 1` sampled configs and the `tuned`
    (template name, config) pairs; every candidate checked bit for bit before it counts."""
    try:
        from lowbit.kernels import get_template
        from lowbit.kernels.triton import CONV2D_INT8, GEMM_INT8  # noqa: F401
    except Exception:
        return None, None
    wl = int8_workload(base)
    tmpl = get_template("triton.conv2d_int8" if isinstance(wl, ConvWorkload)
                        else "triton.gemm_int8")
    if not tmpl.supports(wl):
        return None, None
    x, w, params = gpu_inputs(wl, 7)
    want = run(wl, x, w, params)
    configs = [tmpl.default_config(wl)]
    configs += [c for c in tmpl.space(wl).sample(tries + 4, random.Random(0))
                if c != configs[0]][: tries - 1]
    jobs = [(tmpl, c) for c in configs]
    jobs += [(get_template(name), c) for name, c in (migrate_config(t, c) for t, c in tuned)]
    best, best_cfg = None, None
    for t, cfg in jobs:
        try:
            launcher = t.build(wl, cfg).bind(x, w, params)
            if not torch.equal(launcher(), want):
                raise ValueError("not bit-exact")
            us = timed(launcher)
        except Exception as e:  # a config that fails to compile/run is no baseline
            print(f"  int8 {t.name} {dict(cfg)} failed: {type(e).__name__}: {e}"[:200])
            continue
        if best is None or us < best:
            best, best_cfg = us, {"template": t.name, **cfg}
    return best, best_cfg


def tuned_bitserial(wl: Workload, trials: int, budget_s: float, measurer) -> dict:
    """`lowbit.tune` over the bit-serial families: best template and config, trials, wall
    seconds."""
    from lowbit.tune import tune

    db = Path(common.results_dir()) / "bitserial_tune.sqlite"
    t0 = time.perf_counter()
    res = tune(wl, [f for f in FAMILIES if f.supports(wl)], trials=trials, strategy="diversity",
               db=db, measurer=measurer, progress=False, time_budget_s=budget_s)
    return {"template": res.template, "config": dict(res.config) if res.config else None,
            "tuner_us": res.time_us, "trials": res.trials,
            "wall_s": round(time.perf_counter() - t0, 1)}


def knob_values(wl: Workload, name: str) -> tuple:
    """The values a knob takes on `wl` in any family this GPU runs."""
    values = {}
    for f in FAMILIES:
        if f.supports(wl) and name in f.knobs.names:
            values.update(dict.fromkeys(f.knobs[name].values_for(wl)))
    return tuple(values)


def with_twins(wl: Workload, configs: list[Config]) -> list[Config]:
    """configs (kernel parameters), each followed by its twins in the other ROWSUM modes and
    the other REQUANT mode where the families have them, by its FUSE_PLANES twin (the config
    itself only), and by the THR_PAIRS twins of itself, its ROWSUM and its ROW_TABLE twins."""
    out: list[Config] = []
    for c in configs:
        other_rowsums = [c.replace(ROWSUM=v) for v in knob_values(wl, "ROWSUM")]
        other_requant = c.replace(REQUANT=OTHER_REQUANT[c["REQUANT"]])
        twins = [c, *other_rowsums, other_requant]
        twins += [t.replace(ROW_TABLE=v) for t in twins for v in knob_values(wl, "ROW_TABLE")]
        twins += [c.replace(FUSE_PLANES=v) for v in knob_values(wl, "FUSE_PLANES")]
        pair_bases = [c, *other_rowsums,
                      *(c.replace(ROW_TABLE=v) for v in knob_values(wl, "ROW_TABLE"))]
        twins += [t.replace(THR_PAIRS=v) for t in pair_bases
                  for v in knob_values(wl, "THR_PAIRS")]
        out += [t for t in dict.fromkeys(twins) if valid(wl, t) and t not in out]
    return out


def listed_configs(wl: Workload, listed: list[dict], name: str, prec: str) -> list[Config]:
    """The valid configs of `listed` ({workload, precision, config}: kernel parameters that
    override the plain wgmma default's, `plain_spec`) for this row; an invalid one is reported
    and left out."""
    out = []
    for entry in listed:
        if (entry["workload"], entry["precision"]) != (name, prec):
            continue
        cfg = plain_spec(wl).replace(**entry["config"])
        if valid(wl, cfg):
            out.append(cfg)
        else:
            print(f"{name} {prec}: listed config in no family's space: {cfg.to_json()}")
    return out


def exact_tries(row: dict) -> list[dict]:
    """A result row's timed bit-exact tries ({config, us, exact}), fastest first."""
    return sorted((t for t in row.get("tried", []) if t.get("exact") and t.get("us")),
                  key=lambda t: t["us"])


def earlier_bests(paths: list[Path], n: int = 3) -> dict[tuple[str, str], list[Config]]:
    """The n fastest distinct exact configs (kernel parameters) of each (workload, precision)
    row over earlier bitserial-*.json results, to be re-timed beside this run's candidates."""
    timed: dict[tuple[str, str], dict[Config, float]] = {}
    for path in paths:
        for row in json.loads(Path(path).read_text())["rows"]:
            seen = timed.setdefault((row["workload"], row["precision"]), {})
            for t in exact_tries(row):
                cfg = tried_spec(row, t)
                seen[cfg] = min(t["us"], seen.get(cfg, t["us"]))
    return {key: sorted(seen, key=seen.get)[:n] for key, seen in timed.items()}


def baselines(name: str, base: Workload, tries: int, tuned: list[tuple[str, Config]] = ()
              ) -> dict:
    b: dict = {}
    int8, int8_cfg = int8_best_us(base, tries, tuned)
    if int8 is not None:
        b["int8_best"] = int8
        b["int8_best_config"] = int8_cfg
    if isinstance(base, ConvWorkload):
        b["int_mm_im2col"] = common.int_mm_im2col_us(base, cuda_graph=True)
        b["cudnn_fp16"] = common.cudnn_fp16_conv_us(base, cuda_graph=True)
    else:
        b["int_mm"] = common.int_mm_us(base)
        b["fp16_matmul"] = common.fp16_gemm_us(base)
    return b


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tries", type=int, default=4, help="bit-serial configs per row")
    ap.add_argument("--int8-tries", type=int, default=3)
    ap.add_argument("--no-persist", action="store_true", help="one-tile-per-block kernels only")
    ap.add_argument("--precisions", default=",".join(PRECISIONS),
                    help="comma-separated subset of " + ",".join(PRECISIONS))
    ap.add_argument("--partial", default=None, help="also rewrite this JSON file after each row")
    ap.add_argument("--layers", type=lambda v: v.split(","), default=None,
                    help="comma-separated workload names (default: all)")
    ap.add_argument("--tune-trials", type=int, default=0,
                    help="tune each bit-serial row with lowbit.tune first (0: off)")
    ap.add_argument("--tune-budget-s", type=float, default=90.0, help="per tuned row")
    ap.add_argument("--int8-timed", type=Path, nargs="*", default=[],
                    help="timed-*.json of benchmarks/tuning.py: tuned int8 configs")
    ap.add_argument("--configs", type=Path, nargs="*", default=[],
                    help="earlier bitserial-*.json: re-time each row's best configs, and "
                         "their ROWSUM, REQUANT and ROW_TABLE twins")
    ap.add_argument("--configs-per-row", type=int, default=3,
                    help="how many of each earlier row's fastest configs --configs re-times")
    ap.add_argument("--extra-configs", type=Path, default=None,
                    help="JSON list of {workload, precision, config}: each config (knob "
                         "overrides of the row's plain wgmma default) is timed too, as listed")
    ap.add_argument("--focus", action="store_true",
                    help="time only the default config and the --configs ones with twins")
    args = ap.parse_args()
    t0 = time.time()
    from conv import timed_bests

    int8_tuned = timed_bests(args.int8_timed)
    earlier = earlier_bests(args.configs, args.configs_per_row)
    listed = json.loads(args.extra_configs.read_text()) if args.extra_configs else []
    measurer = None
    if args.tune_trials:
        from lowbit.tune import LocalMeasurer

        measurer = LocalMeasurer(device="cuda")
    peaks = dataclasses.replace(gpu_spec_for(common.gpu_name()), bandwidth=measure_bandwidth())
    rows: list[dict] = []
    try:
        for name, base in workloads(args.quick):
            if args.layers and name not in args.layers:
                continue
            if time.time() - t0 > args.budget_s:
                print(f"budget spent: skipping {name} and the rest")
                break
            try:
                tuned = [(t, c) for (n, t), cs in int8_tuned.items() if n == name for c in cs]
                base_us = baselines(name, base, args.int8_tries, tuned)
            except Exception as e:
                base_us = {"error": f"{type(e).__name__}: {e}"[:300]}
            base_us = {k: v for k, v in base_us.items() if v is not None}
            for prec in [p for p in PRECISIONS if p in args.precisions.split(",")]:
                if time.time() - t0 > args.budget_s:
                    break
                wl = bitserial_workload(base, prec)
                row = {"workload": name, "precision": prec,
                       "epilogue": wl.epilogue.key, "workload_key": wl.key,
                       "floor_us": workload_floor_us(wl, "bitserial", peaks)}
                try:
                    extra = with_twins(wl, earlier.get((name, prec), []))
                    extra += listed_configs(wl, listed, name, prec)
                    if measurer is not None:
                        row["tuned"] = tuned_bitserial(wl, args.tune_trials,
                                                       args.tune_budget_s, measurer)
                        if row["tuned"]["config"]:
                            extra.append(kernel_spec(row["tuned"]["template"],
                                                     row["tuned"]["config"]))
                    row.update(bitserial_row(wl, len(rows), args.tries, not args.no_persist,
                                             extra, args.focus))
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {e}"[:500]
                    traceback.print_exc()
                ref = APNN_TC_US.get((name, prec))
                row["baselines_us"] = {k: v for k, v in base_us.items()
                                       if not k.endswith("_config")}
                row["baseline_configs"] = {k: v for k, v in base_us.items()
                                           if k.endswith("_config")}
                row["baselines_us"]["default_config"] = row.get("default_config_us")
                if ref:
                    row["apnn_tc_published_us"] = ref
                rows.append(row)
                if args.partial:
                    Path(args.partial).write_text(json.dumps(rows, indent=1))
                print(f"{name:24s} {prec} {row.get('time_us', float('nan')):9.1f} us "
                      f"floor {row['floor_us']:7.1f} {row.get('config', row.get('error', ''))}",
                      flush=True)
    finally:
        if measurer is not None:
            measurer.close()
        path = common.write_results("bitserial", rows,
                                    extra={"targets": TARGETS, "peaks": peaks.peaks()})
        print(f"wrote {path}")
        summarize(rows)


def summarize(rows: list[dict]) -> None:
    print(f"\n{'workload':24s} {'prec':5s} {'us':>8s} {'floor':>7s} {'/floor':>6s} "
          f"{'int8x':>6s} {'cudnnx':>6s} {'int_mm':>6s} {'apnnx':>6s}")
    for r in rows:
        t = r.get("time_us")
        if not t or t != t:
            print(f"{r['workload']:24s} {r['precision']:5s} FAILED {r.get('error', '')[:60]}"
                  f"{r.get('errors', '')}")
            continue
        b = r["baselines_us"]

        def ratio(key, b=b, t=t):
            v = b.get(key)
            return f"{v / t:6.2f}" if v else "     -"

        mm = "int_mm" if "int_mm" in b else "int_mm_im2col"
        apnn = r.get("apnn_tc_published_us")
        print(f"{r['workload']:24s} {r['precision']:5s} {t:8.1f} {r['floor_us']:7.1f} "
              f"{t / r['floor_us']:6.2f} {ratio('int8_best')} {ratio('cudnn_fp16')} "
              f"{ratio(mm)} {(f'{apnn / t:6.2f}' if apnn else '     -')}")


if __name__ == "__main__":
    main()
