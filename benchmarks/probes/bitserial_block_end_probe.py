"""ResNet-50's block ends at batch 256 with the block end inside the conv kernel (GPU).

Each bottleneck block of ResNet-50 ends in a 1x1 conv (conv3: layer1 64 -> 256 at 56 x 56,
layer2 128 -> 512 at 28 x 28, layer3 256 -> 1024 at 14 x 14, layer4 512 -> 2048 at 7 x 7)
whose output joins the 8-bit residual stream: q = clamp((acc m + b + res r + 2^(s-1)) >> s,
0, 255), ReLU, stored as the u8 stream, and the next block's input, u2 bit planes. Per layer
and precision (w1a2, w2a2) this probe times:

- "block_end": the bit-serial kernel `default_bitserial` picks, its own epilogue reading the
  s8 residual and writing the u8 stream and the u2 planes (Epilogue requant32 + derived);
- "today": the kernel writing its int16 accumulator (Epilogue(out="int16")) followed by the
  Triton layer epilogue (`netops.bind_layer_epilogue`: the same 8-bit residual, the u8 stream
  and the u2 planes), timed as one CUDA graph, and each part alone;

beside each path's byte floor (`perfmodel.roofline.floor_us`: the bytes it must move at the
copy bandwidth measured in this run, the bit-serial ops at the measured peak) and the
block end's floor ("acc-free": the operands, 1 byte of residual read and 1 byte + 2 bits
written per output value). Each block-end kernel is checked bit for bit against
`lowbit.reference.run_outputs` on a batch-2 copy of the layer first.

    python benchmarks/probes/bitserial_block_end_probe.py [--batch 256] [--precisions w1a2]
        [--no-today]
    (rows to $OUT/bitserial_block_end_probe.json)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bitserial import gpu_inputs, timed
from common import write_probe
from lowbit.core import Config, ConvWorkload, Epilogue, Layout, PackedTensor, Precision, Workload
from lowbit.core.epilogue import EpilogueParams
from lowbit.core.hardware import gpu_spec_for
from lowbit.core.validate import (
    derived_storage,
    operand_shapes,
    out_storage,
    residual_storage,
    storage_dtype,
    storage_shape,
)
from lowbit.kernels.base import acc_bound
from lowbit.kernels.cuda import default_bitserial
from lowbit.perfmodel.roofline import floor_us, measure_bandwidth
from lowbit.reference import random_inputs, run_outputs

BP, I8 = Layout.BITPLANE, Layout.INT8
U2, U8, S8 = Precision(2), Precision(8), Precision(8, "signed")
WEIGHTS = {"w1a2": Precision(1, "binary"), "w2a2": Precision(2, "signed")}
#: (layer, H = W, C, K) of the block-ending 1x1 convs
LAYERS = [("layer1", 56, 64, 256), ("layer2", 28, 128, 512), ("layer3", 14, 256, 1024),
          ("layer4", 7, 512, 2048)]
#: configs beside the default, per precision (knob changes): two blocks per SM without
#: spills (ptxas, sm_90a: w1a2 104 registers, w2a2 90; the defaults keep 168-172 and one block)
ALTERNATIVES = {"w1a2": [dict(BM=128, BN=128, WN=128, FUSE_PLANES=1),
                         dict(BM=128, BN=256, WN=256, FUSE_PLANES=1),
                         dict(BM=64, BN=256, WN=256, FUSE_PLANES=1),
                         dict(BM=128, BN=64, WN=64, FUSE_PLANES=1),
                         dict(BM=64, BN=128, WN=128, FUSE_PLANES=1),
                         dict(BM=192, BN=128, WN=128, FUSE_PLANES=1)],
                "w2a2": [dict(BM=128, BN=64, WN=64, FUSE_PLANES=1)]}
BLOCK_END = Epilogue(shifted_bias=True, relu=True, out=U8, out_layout=I8, requant32=True,
                     residual=S8, derived=((U2, BP),))


def layer(w: Precision, hw: int, c: int, k: int, batch: int, epi: Epilogue) -> ConvWorkload:
    return ConvWorkload(w=w, a=U2, w_layout=BP, a_layout=BP, epilogue=epi, N=batch, H=hw, W=hw,
                        C=c, K=k, R=1, S=1, stride=1, pad=0)


def nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = torch.empty((), dtype=dtype).element_size()
    for s in shape:
        n *= s
    return n


def operand_bytes(wl: Workload) -> int:
    xs, ws, _ = operand_shapes(wl)
    return (nbytes(storage_shape(xs, wl.a, wl.a_layout), storage_dtype(wl.a, wl.a_layout))
            + nbytes(storage_shape(ws, wl.w, wl.w_layout), storage_dtype(wl.w, wl.w_layout)))


def block_end_bytes(wl: Workload) -> int:
    """The acc-free floor's bytes: operands, residual read, mid and derived outputs written."""
    total = operand_bytes(wl) + nbytes(*out_storage(wl)) + nbytes(*residual_storage(wl))
    return total + sum(nbytes(*d) for d in derived_storage(wl))


def exact_small(w: Precision, hw: int, c: int, k: int, batch: int,
                changes: dict | None = None) -> bool:
    """The batch-`batch` layer's default kernel (with `changes`), run on an odd batch of at
    least 600 rows, equals the reference."""
    small = layer(w, hw, c, k, max(3, -(-600 // (hw * hw))) | 1, BLOCK_END)
    family, cfg = default_bitserial(layer(w, hw, c, k, batch, BLOCK_END))
    cfg = Config({**cfg, **(changes or {})})
    x, wt, params = random_inputs(small, seed=1)
    params_gpu = params.to("cuda")
    out = family.build(small, cfg).bind(x.cuda(), wt.cuda(), params_gpu)()
    got = [out.cpu(), *(b.cpu() for b in params_gpu.derived_out)]
    return all(torch.equal(a, b) for a, b in zip(got, run_outputs(small, x, wt, params),
                                                 strict=True))


def block_end_row(name: str, prec: str, w: Precision, hw: int, c: int, k: int, batch: int,
                  peaks, changes: dict | None = None) -> dict:
    """The default block-end kernel's row; `changes`: knobs changed from it (an alternative
    config, e.g. ALTERNATIVES')."""
    wl = layer(w, hw, c, k, batch, BLOCK_END)
    family, cfg = default_bitserial(wl)
    if changes:
        cfg = Config({**cfg, **changes})
        reason = family.space(wl).why_invalid(cfg)
        if reason:
            return {"layer": name, "precision": prec, "path": "block_end_alt",
                    "config": dict(cfg), "skipped": reason}
    x, wt, params = gpu_inputs(wl, seed=2)
    launch = family.build(wl, cfg).bind(x, wt, params)
    us = timed(launch)
    ops = wl.ops * w.bits * wl.a.bits
    nb = block_end_bytes(wl)
    floor = floor_us(ops, nb, peaks.b1_and, peaks.bandwidth)
    exact = exact_small(w, hw, c, k, batch, changes)
    return {"layer": name, "precision": prec, "path": "block_end_alt" if changes else "block_end",
            "family": family.name, "config": dict(cfg), "time_us": us, "bytes": nb,
            "floor_us": floor, "ratio": us / floor, "exact_small": exact}


def today_row(name: str, prec: str, w: Precision, hw: int, c: int, k: int, batch: int,
              peaks) -> dict:
    """The int16 kernel and the Triton layer epilogue pass (module docstring)."""
    from lowbit.kernels.triton import netops

    wl = layer(w, hw, c, k, batch, Epilogue(out="int16"))
    family, cfg = default_bitserial(wl)
    x, wt, _ = gpu_inputs(wl, seed=3)
    kernel = family.build(wl, cfg).bind(x, wt, EpilogueParams())
    y = kernel()
    shape = operand_shapes(wl)[2]
    g = torch.Generator(device="cuda").manual_seed(4)
    res = torch.randint(-128, 128, shape, generator=g, device="cuda", dtype=torch.int8)
    m = torch.randint(2**18, 2**19, (k,), generator=torch.Generator().manual_seed(5))
    r = torch.randint(2**14, 2**15, (k,), generator=torch.Generator().manual_seed(6))
    specs = [netops.Requantized(U8, m, 24, None, r, True),
             netops.Requantized(U2, m >> 6, 24, None, r >> 6, True)]
    outs = [netops.empty_packed(shape, U8, I8, "cuda"), netops.empty_packed(shape, U2, BP, "cuda")]
    epilogue = netops.bind_layer_epilogue(y, specs, outs, PackedTensor(res, shape, S8, I8),
                                          acc_bound(wl))

    def both() -> None:
        kernel()
        epilogue()

    us, us_kernel, us_pass = timed(both), timed(kernel), timed(epilogue)
    ops = wl.ops * w.bits * wl.a.bits
    y_bytes = nbytes(*out_storage(wl))
    out_bytes = sum(o.data.numel() * o.data.element_size() for o in outs)
    nb = operand_bytes(wl) + 2 * y_bytes + res.numel() + out_bytes
    floor = floor_us(ops, nb, peaks.b1_and, peaks.bandwidth)
    return {"layer": name, "precision": prec, "path": "today", "family": family.name,
            "config": dict(cfg), "time_us": us, "kernel_us": us_kernel, "pass_us": us_pass,
            "bytes": nb, "floor_us": floor, "ratio": us / floor}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--precisions", nargs="+", choices=sorted(WEIGHTS), default=list(WEIGHTS))
    ap.add_argument("--no-today", action="store_true",
                    help="skip the int16 kernel + separate pass rows")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bitserial_block_end_probe needs a CUDA GPU")
    from dataclasses import replace

    peaks = replace(gpu_spec_for(torch.cuda.get_device_name()), bandwidth=measure_bandwidth())
    rows = []
    for prec in args.precisions:
        w = WEIGHTS[prec]
        for name, hw, c, k in LAYERS:
            runs = [(block_end_row, None), *((block_end_row, a) for a in ALTERNATIVES[prec]),
                    *(() if args.no_today else ((today_row, None),))]
            for path, changes in runs:
                extra = (changes,) if changes else ()
                try:
                    rows.append(path(name, prec, w, hw, c, k, args.batch, peaks, *extra))
                except Exception as e:  # one row failing must not lose the others
                    rows.append({"layer": name, "precision": prec, "path": path.__name__,
                                 "config": changes, "error": f"{type(e).__name__}: {e}"[:300]})
                r = rows[-1]
                write_probe("bitserial_block_end_probe", rows)  # a cut run keeps its rows
                print(f"{prec} {name} {r['path']:13s} " + (
                    f"{r['time_us']:8.1f} us  floor {r['floor_us']:7.1f} us  "
                    f"x{r['ratio']:.2f}  {r['family']}" + (f" exact={r['exact_small']}"
                                                          if "exact_small" in r else "")
                    if "time_us" in r else r.get("error", r.get("skipped"))), flush=True)
    rows.append({"bandwidth_tb_per_s": peaks.bandwidth / 1e12})
    print("wrote", write_probe("bitserial_block_end_probe", rows))


if __name__ == "__main__":
    main()
