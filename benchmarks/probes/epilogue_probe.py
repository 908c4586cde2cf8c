"""One bit-serial layer's untuned kernel timed under each epilogue form (GPU).

Where the time of a store-bound layer goes: the same conv (default ResNet-50 layer1's 1x1
block end: batch 256, 56 x 56, 64 -> 256 channels, w1a2) with int32, fp16, requantized INT8
and bit-plane outputs, with and without a shifted bias and a 24- / 16-bit residual. Each row:
the default family and config `default_bitserial` picks for that epilogue, the median time,
the bytes the epilogue moves (output written, residual read; the operands are a few MB) and
the bandwidth they imply. Output checked against `lowbit.reference` on the first 2 images'
rows (the kernel runs the whole batch).

    python benchmarks/probes/epilogue_probe.py [--batch 256]    # rows to $OUT/epilogue_probe.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bitserial import gpu_inputs
from common import write_probe
from lowbit.core import Config, ConvWorkload, Epilogue, Layout, Precision, WidePrecision
from lowbit.kernels.cuda import default_bitserial
from lowbit.reference import random_inputs, run
from lowbit.tune.timing import time_us

BP, I8 = Layout.BITPLANE, Layout.INT8
U2, S8 = Precision(2), Precision(8, "signed")
EPILOGUES = {
    "int32": Epilogue(),
    "fp16": Epilogue(bias=True, out="fp16"),
    "sbias->s8/int8": Epilogue(shifted_bias=True, out=S8, out_layout=I8),
    "sbias+relu->u2/bitplane": Epilogue(shifted_bias=True, relu=True, out=U2, out_layout=BP),
    "sbias+relu->u2/bitplane multiply": Epilogue(shifted_bias=True, relu=True, out=U2,
                                                 out_layout=BP),
    "sbias+res24+relu->u2/bitplane": Epilogue(shifted_bias=True, relu=True, out=U2,
                                              out_layout=BP, residual=WidePrecision(24)),
    "sbias+res16+relu->u2/bitplane": Epilogue(shifted_bias=True, relu=True, out=U2,
                                              out_layout=BP, residual=WidePrecision(16)),
}


def layer(batch: int, epi: Epilogue) -> ConvWorkload:
    return ConvWorkload(w=Precision(1, "binary"), a=U2, w_layout=BP, a_layout=BP, epilogue=epi,
                        N=batch, H=56, W=56, C=64, K=256, R=1, S=1, stride=1, pad=0)


def probe(batch: int, name: str, epi: Epilogue) -> dict:
    """One epilogue form's row: checked on 2 images, timed on `batch`."""
    small = layer(2, epi)
    family, cfg = default_bitserial(layer(batch, epi))
    if name.endswith(" multiply"):  # the residual's path (64-bit multiply-add), no residual
        cfg = Config({**cfg, "REQUANT": "multiply", "THR_PAIRS": 0})
    x, w, params = random_inputs(small, seed=1)
    got = family.build(small, cfg)(x.cuda(), w.cuda(), params.to("cuda")).cpu()
    exact = bool(torch.equal(got, run(small, x, w, params)))
    wl = layer(batch, epi)
    x, w, params = gpu_inputs(wl, seed=2)
    launch = family.build(wl, cfg).bind(x, w, params)
    us = time_us(launch, rep_ms=200)
    out = launch()
    out_bytes = out.numel() * out.element_size()
    res = params.residual
    res_bytes = 0 if res is None else res.numel() * res.element_size()
    return {"epilogue": name, "family": family.name, "config": dict(cfg), "time_us": us,
            "out_bytes": out_bytes, "residual_bytes": res_bytes,
            "tb_per_s": (out_bytes + res_bytes) / us / 1e6, "exact_small": exact}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    rows = []
    for name, epi in EPILOGUES.items():
        try:
            rows.append(probe(args.batch, name, epi))
        except Exception as e:  # one form failing must not lose the others
            rows.append({"epilogue": name, "error": f"{type(e).__name__}: {e}"[:300]})
        r = rows[-1]
        print(f"{name:32s} " + (f"{r['time_us']:8.1f} us {r['tb_per_s']:5.2f} TB/s "
                                f"{r['family']} WN={r['config'].get('WN')} exact={r['exact_small']}"
                                if "error" not in r else r["error"]), flush=True)
    path = write_probe("epilogue_probe", rows)
    print("wrote", path)


if __name__ == "__main__":
    main()
