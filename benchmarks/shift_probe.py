"""Where the tap-shift kernel's time goes (device call): its persistent kernel timed with parts
cut out of its rendered source (measurement only: the cut variants compute garbage).

Variants: base; thr_global and weights_team0 (exact: the thresholds read from global memory,
the weights copied by team 0 alone, as before 2026-11-25); fused (exact: FUSE_PLANES=1, the
activation planes summed in one accumulator); cols (exact: ROWSUM="cols"); no_epilogue (the
epilogue replaced by one conditional store, so the MMAs stay);
no_loads (the slab of the first two tiles reused: MMAs + epilogue); aligned (every A
descriptor rounded to a 128-byte boundary with the standard 128-byte LBO: the same MMAs on
unshifted core matrices); aligned + no_epilogue; no_rowsum (binary weights: the row-popcount
wgmma m64n8k256 of every plane and step left out); no_rowsum + no_epilogue. Prints and writes
$OUT/shift_probe.json.

Usage: python benchmarks/shift_probe.py [--rows s3:w1a1:256:128:128 ...] [--variants base ...]
(a row: stage:precision:BM:BN:WN[:TEAMS[:ROWSUM[:ROW_TABLE]]], by default TEAMS=1, ROWSUM="mma"
and ROW_TABLE=1 where the space has it, else 0; the no_loads cut needs ROW_TABLE < 2)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from bitserial import bitserial_workload, gpu_inputs, workloads
from lowbit.kernels.cuda import BITSERIAL, bitserial
from lowbit.tune.timing import time_us

EPILOGUE = ("      tile_epilogue(cur, cur_rs, rows, tile * BM, n0, row0, col0, lane, tid, ea, "
            "s_out);")
CUTS = {
    "no_epilogue": [(EPILOGUE, "      if (cur[0][0][0][0][0] == 0x7fffffff && tile < 0) "
                               "((int*)out)[0] = cur_rs[0][0][0];")],
    "no_loads": [("          load_slabs(x, slabs + ((it + 2) % SLAB_BUFFERS) * SLABS_WORDS, "
                  "tile + 2 * step,\n                     slab_pixels(vpix, tile + 2 * step, "
                  "slots, tid), tid);", "          copy_commit();")],
    "aligned": [("desc_offset(da0, i * A_SHIFT_PLANE / 4 + OFF, LBO)",
                 "desc_offset(da0, i * A_SHIFT_PLANE / 4 + (OFF & ~7), 8)")],
    "no_rowsum": [("if constexpr (ROWSUM_MMA) wgmma_rowsum(rsum[i], da, "
                   "desc_offset(d1, ONES * 16), acc_in);",
                   # opaque values, not undefined ones (which LLVM folds the epilogue away on)
                   'asm volatile("" : "=r"(rsum[i][0][0]), "=r"(rsum[i][0][1]), '
                   '"=r"(rsum[i][0][2]), "=r"(rsum[i][0][3]));')],
    # an exact variant: the weights copied by team 0 alone (before 2026-11-25, session 16)
    "weights_team0": [("n0, grp, (int)threadIdx.x,\n                       BLOCK_THREADS);",
                       "n0, grp, team ? BN * 4 : tid, THREADS);")],
}
VARIANTS = {"base": [], "no_epilogue": CUTS["no_epilogue"], "no_loads": CUTS["no_loads"],
            "aligned": CUTS["aligned"],
            "aligned_no_epilogue": CUTS["aligned"] + CUTS["no_epilogue"],
            "no_rowsum": CUTS["no_rowsum"],
            "no_rowsum_no_epilogue": CUTS["no_rowsum"] + CUTS["no_epilogue"],
            "thr_global": [], "weights_team0": CUTS["weights_team0"], "fused": [],
            "cols": []}
# variants that build with other layout functions: thr_global (exact) reads the thresholds from
# global memory, as before 2026-11-25 (no shared-memory slots, the row table's rectangle ids)
PATCHES = {"thr_global": {"threshold_slots": lambda wl, config: 0}}
# variants that are other configs of the space: fused (the two activation planes summed in one
# accumulator by the MMAs, FUSE_PLANES=1), cols (the row popcounts from ones columns in the
# products' wgmma, ROWSUM="cols")
CONFIG_CHANGES = {"fused": {"FUSE_PLANES": 1}, "cols": {"ROWSUM": "cols"}}


def variant_render(cuts):
    original = bitserial.render

    def render(wl, config, wgmma_asm=True, chained=0):
        text = original(wl, config, wgmma_asm, chained)
        for old, new in cuts:
            if text.count(old) != 1:
                raise RuntimeError(f"probe cut not found: {old[:60]}")
            text = text.replace(old, new)
        return text
    return render


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", nargs="*", default=["s2:w1a1:64:64:64", "s3:w1a1:256:128:128",
                                                  "s4:w1a1:128:128:128", "s5:w1a2:128:128:128"])
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    args = ap.parse_args()
    layers = dict(workloads(False))
    original, results = bitserial.render, []
    for spec in args.rows:
        stage, prec, bm, bn, wn, *extra = spec.split(":")
        teams, rowsum, row_table = (extra + [1, "mma", None][len(extra):])[:3]
        wl = bitserial_workload(layers[f"resnet50_{stage}_3x3_b256"], prec)
        space = BITSERIAL.space(wl)
        cfg = next(c for c in space if c["TAP_SHIFT"] and c["PERSIST"] and c["SWIZZLE"] == 32
                   and (c["BM"], c["BN"], c["WN"]) == (int(bm), int(bn), int(wn))
                   and c["ROWSUM"] == rowsum
                   and c["REQUANT"] == space.knob("REQUANT").values[-1]
                   and c["STAGES"] == 3 and c["TEAMS"] == int(teams) and not c["FUSE_PLANES"]
                   and c["ROW_TABLE"] == (min(1, space.knob("ROW_TABLE").values[-1])
                                          if row_table is None else int(row_table)))
        x, w, params = gpu_inputs(wl, 1)
        row = {"row": spec, "config": dict(cfg)}
        for name in args.variants:
            cuts, patches = VARIANTS[name], PATCHES.get(name, {})
            saved = {f: getattr(bitserial, f) for f in patches}
            bitserial.render = variant_render(cuts)
            try:
                for f, fn in patches.items():
                    setattr(bitserial, f, fn)
                launch = BITSERIAL.build(wl, cfg.replace(**CONFIG_CHANGES.get(name, {}))).bind(
                    x, w, params)
                row[name] = time_us(launch, cuda_graph=True)
            except Exception as e:  # a variant that fails to build is reported, not fatal
                row[name] = f"{type(e).__name__}: {e}"[:200]
            finally:
                bitserial.render = original
                for f, fn in saved.items():
                    setattr(bitserial, f, fn)
        print(json.dumps(row), flush=True)
        results.append(row)
    common.write_probe("shift_probe", results)


if __name__ == "__main__":
    main()
