"""Where the APNN-TC conv's time goes (device call): one-tile bit-serial kernels on the APNN-TC
layer (batch 1, 16 x 16, C = K = 1,024, 3 x 3) timed whole, with parts skipped, and an empty
kernel of the same grid, block and shared memory (measurement only: the cut variants compute
garbage).

Variants: base; no_weights / no_halo (A_IN_HALO: the weight or the halo copies left out);
even_stride (A_IN_HALO: the halo's chunks at the even stride first built); b_by_row (A_IN_HALO:
the weight copies in the other kernels' thread order); halo_first (A_IN_HALO: the whole
halo with the first stage; measured in `apconv_probe-20261126-s21-staged.json`, removed with
that kernel path);
rows_first / no_prefetch (A_IN_HALO: the epilogue's rows and L1 prefetches before the first
copies are issued, or no prefetches);
no_mma (every stage's MMAs skipped behind a branch the GPU never takes, so the
code stays); no_epilogue (the epilogue skipped the same way); no_mma_no_epilogue (copies and
the pipeline's barriers alone); no_gather and no_halo_wait (HALO=1: the stages' A tiles not
gathered from the halo; the first stages' copies not waiting for the halo's); mma_first (wgmma:
a stage's MMAs issued before the next stage's copies and gather instead of after); empty (an
empty kernel launched like the base one).
Configs: the committed best of each precision and a few neighbours (KT / STAGES, k slices,
mma.sync). Prints and writes $OUT/apconv_probe.json (the first run, 2026-11-25, varied KT and
STAGES: `apconv_probe-20261125-s18.json`).

no_relayout (a window by bulk copies re-laid by the threads: the kernel path measured in
`apconv_probe-20261126-s22-bulk-halo.json`, removed; NOTES.md).

--chained launches every variant but the empty one with bind(chained=True) (trigger "auto"):
each replay then waits for the one before, as a layer of a chain does.

Usage: python benchmarks/apconv_probe.py [--variants base no_mma ...] [--rows rows.json]
           [--chained]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from bitserial import bitserial_workload, gpu_inputs, workloads
from lowbit.core import Config
from lowbit.kernels.cuda import BITSERIAL, bitserial
from lowbit.kernels.cuda.nvrtc import load_kernel
from lowbit.tune.timing import time_us
from shift_probe import variant_render

# the GPU never takes this branch (shared word 0 holds operand data), but the compiler must
# keep what it guards
NEVER = "if (*(volatile u32*)smem == 0x9E3779B9u) "
MMA_CALL = {"wgmma": "wgmma_stage(acc, rsum, stages + ((kt - k0) % STAGES) * STAGE_WORDS,",
            "mma_sync": "mma_sync_stage(acc, rsum, sa, sa + A_STAGE_WORDS,"}
EPILOGUE_CALL = {"wgmma": "tile_epilogue(acc, rsum, prep, m0, n0, row0, wg_n * WN,",
                 "mma_sync": "tile_epilogue(acc, rsum, m0, n0, warp_m * WM, warp_n * WN,"}
# A_IN_HALO: the line that works out the epilogue's rows and prefetches their data (after the
# first copies are issued), and the loop that issues those copies
_ROWS = ("  if constexpr (A_IN_HALO && !EARLY_ROWS)\n"
         "    rows = prefetched_rows(m0, n0, wg_m, wg_n, warp, lane, slice, "
         "BITSERIAL_EPILOGUE_ARGS);\n")
_FIRST_COPIES = "#pragma unroll\n  for (int s = 0; s < STAGES - 2; ++s) {\n"
# per MMA kind: the (old, new) text pairs of each cut (shift_probe.variant_render applies them,
# each exactly once)
CUTS = {
    "no_mma": {k: [(f"    {c}", f"    {NEVER}{c}")] for k, c in MMA_CALL.items()},
    "no_epilogue": {k: [(f"  {c}", f"  {NEVER}{c}")] for k, c in EPILOGUE_CALL.items()},
    # HALO=1: the stages' A tiles left ungathered (the halo reads die with the stores)
    "no_gather": {k: [("store_shared_vec(halo_dst[it] + i * A_PLANE_STEP, halo_vals[it][i]);",
                       "{}")] for k in MMA_CALL},
    # HALO=1: the first stages' copies issued without waiting for the halo's (their gathers
    # then read a partly landed halo): what the halo's round trip before them costs
    "no_halo_wait": {k: [("  copy_commit();\n  copy_wait<0>();\n  __syncthreads();\n"
                          "  return row0;",
                          "  copy_commit();\n  __syncthreads();\n  return row0;")]
                     for k in MMA_CALL},
    # A_IN_HALO: the stages' weight copies left out (the MMAs read whatever the stages hold),
    # or the halo's: what each stream of copies costs
    "no_weights": {k: [("copy_async(dst + j * B_PLANE_STEP, w + j * W_PLANE + src, valid);",
                        "{}")] for k in MMA_CALL},
    # A_IN_HALO: the halo chunks' stride even (HALO_PIX), as first built
    "even_stride": {k: [("CHUNK_UNITS = (PLANE_GROUPS * HALO_PIX) | 1;",
                         "CHUNK_UNITS = PLANE_GROUPS * HALO_PIX;")] for k in MMA_CALL},
    # A_IN_HALO: the weight copies in the row-major thread order of the other kernels
    "b_by_row": {k: [("constexpr bool B_BY_SLAB = A_IN_HALO;", "constexpr bool B_BY_SLAB = false;")]
                 for k in MMA_CALL},
    "no_halo": {k: [("copy_async(halo + halo_unit(i, chunk, pix) * 4, x + i * X_PLANE + src, "
                     "valid);", "{}")] for k in MMA_CALL},
    # A_IN_HALO: the epilogue's rows and prefetches before the first copies are issued (as
    # first built), or without the prefetches
    "rows_first": {k: [(_ROWS, ""), (_FIRST_COPIES, _ROWS + _FIRST_COPIES)] for k in MMA_CALL},
    "no_prefetch": {k: [("  if (slice == 0) prefetch_row_data(rows, n0 + wg_n * WN + "
                         "2 * (lane & 3), ea);\n", "")] for k in MMA_CALL},
}
# the stage's MMAs issued before the next stage's copies and gather (whose shared-memory
# latency then runs behind them) instead of after: the one-tile kernel's loop, reordered
_LOOP = bitserial._cu("bitserial_wgmma.cu")  # the one-tile kernel's text, as rendered
_NEXT = _LOOP[_LOOP.index("    {\n      const int next = kt + STAGES - 2;"):]
_NEXT = _NEXT[:_NEXT.index("\n    }\n") + len("\n    }\n")]
_MMA = _LOOP[_LOOP.index(f"    {MMA_CALL['wgmma']}"):]
_MMA = _MMA[:_MMA.index(";\n") + 2]
CUTS["mma_first"] = {"wgmma": [(_NEXT + _MMA, _MMA + _NEXT)], "mma_sync": []}
NONE: dict[str, list] = {k: [] for k in MMA_CALL}
VARIANTS = {"base": NONE, **CUTS,
            "no_mma_no_epilogue": {k: CUTS["no_mma"][k] + CUTS["no_epilogue"][k]
                                   for k in MMA_CALL},
            "empty": NONE}
BEST = {  # the rows' best configs (bitserial-20261125-210302.json), without slices
    "w1a2": dict(BM=64, BN=32, TMA_HALO=0, PLANE_ROWS=0, BULK_WEIGHTS=0, FUSE_PLANES=0, HALO=1,
                 KT=2, MMA="wgmma", PERSIST=0,
                 REQUANT="threshold", ROWSUM="mma", ROW_TABLE=0, SLICES=1, SPLIT_K=1, STAGES=4,
                 SWIZZLE=32, TAP_SHIFT=0, TEAMS=1, THR_PAIRS=0, A_IN_HALO=0, WM=64,
                 WN=32),
    "w1a1": dict(BM=64, BN=32, TMA_HALO=0, PLANE_ROWS=0, BULK_WEIGHTS=0, FUSE_PLANES=0, HALO=1,
                 KT=4, MMA="wgmma", PERSIST=0,
                 REQUANT="threshold", ROWSUM="mma", ROW_TABLE=0, SLICES=1, SPLIT_K=1, STAGES=6,
                 SWIZZLE=32, TAP_SHIFT=0, TEAMS=1, THR_PAIRS=0, A_IN_HALO=0, WM=64,
                 WN=32),
}
# the A tiles in place from the halo (A_IN_HALO; the eighteenth and nineteenth sessions' runs
# probed the gathering configs above, apconv_probe-20261125-s18.json / -s19.json), with 2 and
# 8 of the 9 k tiles' weights in flight, and all 9 resident (STAGES=12)
_IN_PLACE = {"A_IN_HALO": 1, "KT": 4}
ROWS = [(p, dict(_IN_PLACE, STAGES=st)) for p in ("w1a2", "w1a1") for st in (4, 12)]
EMPTY = 'extern "C" __global__ void empty_kernel(int* p) { if (p == nullptr) p[0] = 0; }'


def empty_launcher(kernel, x):
    """An empty kernel with `kernel`'s grid, block and dynamic shared memory."""
    empty = load_kernel(EMPTY, "empty_kernel")
    grid = (*kernel._grid, 1)  # one-tile kernels without split-K: the launch of `bind`
    return lambda: empty.launch(grid, kernel._threads, [x], shared_mem=kernel._smem)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--chained", action="store_true",
                    help="launch as programmatic dependents (bind(chained=True)): each replay "
                         "waits for the one before, as a layer of a chain")
    ap.add_argument("--rows", type=Path, default=None,
                    help="JSON list of [precision, knob changes of BEST[precision]] (default: "
                         "ROWS)")
    args = ap.parse_args()
    rows = json.loads(args.rows.read_text()) if args.rows else ROWS
    base_wl = dict(workloads(False))["apconv_b1_c1024"]
    original, results = bitserial.render, []
    for prec, changes in rows:
        wl = bitserial_workload(base_wl, prec)
        cfg = Config(BEST[prec]).replace(**changes)
        row = {"precision": prec, "changes": changes, "config": dict(cfg),
               "chained": args.chained}
        why = BITSERIAL.space(wl).why_invalid(cfg)
        if why:
            row["invalid"] = why
            print(json.dumps(row), flush=True)
            results.append(row)
            continue
        x, w, params = gpu_inputs(wl, 1)
        for name in args.variants:
            bitserial.render = variant_render(VARIANTS[name][cfg["MMA"]])
            try:
                kernel = BITSERIAL.build(wl, cfg)
                launch = (empty_launcher(kernel, x) if name == "empty"
                          else kernel.bind(x, w, params, chained=args.chained))
                row[name] = time_us(launch, cuda_graph=True)
            except Exception as e:  # a variant that fails is reported, not fatal
                row[name] = f"{type(e).__name__}: {e}"[:200]
            finally:
                bitserial.render = original
        print(json.dumps(row), flush=True)
        results.append(row)
    common.write_probe("apconv_probe", results)


if __name__ == "__main__":
    main()
