"""One bit-serial layer's untuned kernel timed under each epilogue form (GPU).

Where the time of a store-bound layer goes: the same conv (default ResNet-50 layer1's 1x1
block end: batch 256, 56 x 56, 64 -> 256 channels, w1a2) with int32, fp16, requantized INT8
and bit-plane outputs, with and without a shifted bias and a 24- / 16-bit residual. Each row:
the default family and config `default_bitserial` picks for that epilogue, the median time,
the bytes the epilogue moves (output written, residual read; the operands are a few MB) and
the bandwidth they imply. Output checked against `lowbit.reference` on the first 2 images'
rows (the kernel runs the whole batch). Then the separate pass a multi-output block end runs
after an int32 / int16 accumulator (`netops.bind_layer_epilogue`: a u2 bit-plane output and a
24-bit wide copy, both with the 24-bit residual, ReLU) at each launch knob (values and warps
per program), checked against `reference.epilogue_outputs` on the first 2 images.

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
from lowbit.kernels.timing import time_us
from lowbit.reference import random_inputs, run

BP, I8 = Layout.BITPLANE, Layout.INT8
U2, S8 = Precision(2), Precision(8, "signed")
EPILOGUES = {
    "int32": Epilogue(),
    "int16": Epilogue(out="int16"),
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


def pass_probe(batch: int, acc: torch.dtype, tile_values: int, warps: int,
               float64: bool) -> dict:
    """The block end's separate pass (module docstring) at one launch knob; float64: the
    multipliers and shifts 2^12 smaller (the same ratios), so the sums stay below 2^53 and
    the pass adds them in float64 (netops FAST), else in int64 (DIRECT)."""
    from lowbit.core import PackedTensor
    from lowbit.kernels.triton import netops
    from lowbit.quant.packing import unpack

    g = torch.Generator().manual_seed(3)
    rows, k = batch * 56 * 56, 256
    wide = WidePrecision(24)
    y = torch.randint(-190, 190, (rows, k), generator=g, dtype=torch.int32).to(acc)
    res = torch.randint(-(2**22), 2**22, (rows, k), generator=g, dtype=torch.int32)
    m = torch.randint(2**40, 2**41, (k,), generator=g)
    r = torch.randint(2**30, 2**31, (k,), generator=g)
    cut = 12 if float64 else 0
    specs = [netops.Requantized(U2, m >> cut, 52 - cut, None, r >> cut, True),
             netops.Requantized(wide, m >> (3 + cut), 27 - cut, None, r >> (3 + cut), True)]
    modes = {netops.requant_mode(sp, k, 2**15, 2**23) for sp in specs}
    outs = [netops.empty_packed((rows, k), U2, BP, "cuda"),
            netops.empty_packed((rows, k), wide, I8, "cuda")]
    res_t = PackedTensor(res.cuda(), (rows, k), wide, I8)
    launch = netops.bind_layer_epilogue(y.cuda(), specs, outs, res_t, 2**15,
                                        tile_values=tile_values, num_warps=warps)
    us = time_us(launch, rep_ms=200)
    n = 2 * 56 * 56
    want = [((y[:n].to(torch.int64) * sp.multiplier + res[:n] * sp.residual_multiplier
              + (1 << (sp.shift - 1))) >> sp.shift).clamp(0, sp.precision.qmax) for sp in specs]
    got = [unpack(o.data.cpu(), o.precision, o.layout, k) if o.layout is BP
           else o.data.cpu().to(torch.int64) for o in outs]
    exact = all(torch.equal(a[:n], b) for a, b in zip(got, want, strict=True))
    nbytes = y.numel() * y.element_size() + 2 * res.numel() * 4 + rows * k // 4
    mode = "float64" if modes == {netops.FAST} else "int64"
    return {"pass": f"{str(acc).removeprefix('torch.')} y, {mode}, {tile_values} values, "
                    f"{warps} warps",
            "time_us": us, "bytes": nbytes, "tb_per_s": nbytes / us / 1e6, "exact_small": exact}


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
    for acc, float64, tile_values, warps in (
            (torch.int32, False, 2048, 4), (torch.int16, False, 2048, 4),
            (torch.int32, True, 2048, 4), (torch.int16, True, 2048, 4),
            (torch.int16, True, 1024, 4), (torch.int16, True, 4096, 4),
            (torch.int16, True, 4096, 8)):
            try:
                rows.append(pass_probe(args.batch, acc, tile_values, warps, float64))
            except Exception as e:
                rows.append({"pass": f"{acc} {float64} {tile_values} {warps}",
                             "error": f"{type(e).__name__}: {e}"[:300]})
            r = rows[-1]
            print(f"{r['pass']:40s} " + (f"{r['time_us']:8.1f} us {r['tb_per_s']:5.2f} TB/s "
                                         f"exact={r['exact_small']}" if "error" not in r
                                         else r["error"]), flush=True)
    path = write_probe("epilogue_probe", rows)
    print("wrote", path)


if __name__ == "__main__":
    main()
