"""What a k split of the APNN-TC conv's in-place blocks could reach, before building it.

A block of a k split s of the APNN-TC conv (b1, 16 x 16, C = K = 1,024, 3 x 3, batch 1) does
the work of a block of the layer with C / s channels and s K output columns: the same pixel tile,
a 1/s share of the weights and window, s times the blocks. This probe times that layer's
in-place configs (bit-exact checked first), alone and chained, for s = 1, 2, 4: the split
kernel would add the partial sums' exchange and split the epilogue, so these times bound it
from below. Writes $OUT/split_bound.json (`common.write_probe`).

Usage: python benchmarks/split_bound.py [--splits 1,2,4] [--precisions w1a2,w1a1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from bitserial import bitserial_workload, gpu_inputs
from layer_chain import timed
from lowbit.core import Config, ConvWorkload
from lowbit.kernels.cuda import BITSERIAL, bitserial
from lowbit.reference import run


def configs(wl) -> list[Config]:
    """The default config and its 32 / 64-wide in-place twins with bulk weights, with the
    window by cp.async or by tensor copies (the widest swizzle the channels allow), each at
    the largest KT (4, 2, 1) the space takes."""
    space, d = BITSERIAL.space(wl), BITSERIAL.default_config(wl)
    twins = [d]
    for bn in (32, 64):
        for tmas in ((0,), (128, 64, 32)):
            valid = [c for tma in tmas for kt in (4, 2, 1)
                     if space.is_valid(c := d.replace(
                         A_IN_HALO=1, HALO=1, BN=bn, WN=bn, BULK_WEIGHTS=1, TMA_HALO=tma, KT=kt,
                         STAGES=12, PERSIST=0, TAP_SHIFT=0, ROWSUM="mma", SLICES=1))]
            twins += valid[:1]
    return list(dict.fromkeys(twins))


def probe_row(wl, cfg: Config) -> dict:
    kernel = BITSERIAL.build(wl, cfg)
    x, w, params = gpu_inputs(wl, 3)
    want = run(wl, x, w, params)
    out = torch.empty_like(want)
    out.view(torch.uint8).fill_(0xA5)
    plain = kernel.bind(x, w, params, out=out)
    plain()
    torch.cuda.synchronize()
    row = {"config": dict(cfg), "blocks": list(bitserial.tile_grid(wl, cfg)),
           "exact": bool(torch.equal(out, want))}
    if row["exact"]:
        chained = kernel.bind(x, w, params, out=out, chained=True)
        row["isolated_us"] = timed(plain)
        row["chained_us"] = timed(chained)  # each replay a dependent of the one before
        row["chain_trigger"] = chained.chain_trigger
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", type=lambda v: [int(s) for s in v.split(",")], default=[1, 2, 4])
    ap.add_argument("--precisions", type=lambda v: v.split(","), default=["w1a2", "w1a1"])
    args = ap.parse_args()
    rows = []
    for split in args.splits:
        base = ConvWorkload(N=1, H=16, W=16, C=1024 // split, K=1024 * split, R=3, S=3, pad=1)
        for prec in args.precisions:
            wl = bitserial_workload(base, prec)
            for cfg in configs(wl):
                try:
                    row = probe_row(wl, cfg)
                except Exception as e:  # a config that fails is recorded, not fatal
                    row = {"config": dict(cfg), "error": f"{e!r}"[:300]}
                row.update(split=split, precision=prec, workload_key=wl.key)
                rows.append(row)
                print(split, prec, {k: v for k, v in row.items() if k.endswith("us")},
                      cfg["BN"], cfg["TMA_HALO"], row.get("exact"), flush=True)
    print(f"wrote {common.write_probe('split_bound', rows)}")


if __name__ == "__main__":
    main()
