"""A block end with an 8-bit residual inside the int8 conv, against today's wide path (GPU),
and the 32-bit requantization of a plain conv's own epilogue.

Block end: ResNet-50's layer1 conv3 at batch 256 (1x1, 64 -> 256, 56 x 56, u8 activations).
Rows, each with its bytes (every tensor read or written once: x, w, residual, outputs, and the
int32 accumulator written and read back where a separate pass runs), its floor
max(bytes / copy bandwidth measured in this run, ops / int8 peak) (`perfmodel.roofline`) and
its time over the floor:
- wide, kernel + pass: today's separate path (24-bit residual, u8 + 24-bit outputs);
- wide, fused: the same outputs from the conv's own epilogue (`conv_outputs`);
- narrow (u8 residual, the stored u8 mid value + a u8 derived at another scale through a
  table), fused, float64 requantization (31-bit multipliers) and int32 (`fixed_point_pair32`)
  at several output tiles (registers and spills from Triton's compile), and through the
  separate pass; and the stored u8 + a derived u2 in bit planes (a w1a2 network's block end);
- the conv alone writing int32 (the main loop and an int32 store).
Fused outputs are checked against the separate pass's on the whole batch, the pass against
`reference.epilogue_outputs` on the first two images.

Plain conv: MobileNet-V2's 24 -> 144 pointwise at 56 x 56, batch 8, writing u8 (ReLU, shifted
bias) with float64 requantization (31-bit multipliers) and int32 (multipliers of the
workload's acc_bound), against the int32 output; each bit-exact against `reference.run`.

    python benchmarks/probes/block_end_probe.py    # rows to $OUT/block_end_probe.json
    python benchmarks/probes/block_end_probe.py --tiny    # CPU smoke run (TRITON_INTERPRET=1)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if "--tiny" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import write_probe
from lowbit.core import ConvWorkload, Epilogue, Layout, PackedTensor, Precision, WidePrecision
from lowbit.core.epilogue import EpilogueParams
from lowbit.core.hardware import H100, gpu_spec_for
from lowbit.kernels.base import acc_bound
from lowbit.kernels.timing import time_us
from lowbit.kernels.triton import CONV2D_INT8
from lowbit.kernels.triton import netops as K
from lowbit.kernels.triton.conv_outputs import FUSED_TILE, bind_conv_outputs
from lowbit.kernels.triton.templates import with_float64_requant
from lowbit.perfmodel.roofline import floor_us, measure_bandwidth
from lowbit.reference import RequantizedOutput, epilogue_outputs, fixed_point_pair, run
from lowbit.reference.netops import fixed_point_pair32

TINY = "--tiny" in sys.argv
DEVICE = "cpu" if TINY else "cuda"
S24 = WidePrecision(24)
U8 = Precision.parse("u8")
INT8, BITPLANE = Layout.INT8, Layout.BITPLANE
BLOCK_END = ConvWorkload(N=2 if TINY else 256, H=7 if TINY else 56, W=7 if TINY else 56,
                         C=64, K=256, R=1, S=1, a="u8")
POINTWISE = ConvWorkload(N=1 if TINY else 8, H=5 if TINY else 56, W=5 if TINY else 56, C=24,
                         K=144, R=1, S=1, a="s8")
TILES = [(64, 32, 2), (64, 64, 4), (128, 64, 4), (64, 128, 4), (128, 128, 4), (128, 128, 8)]
LEVELS = torch.arange(256)


def nbytes(*tensors) -> int:
    return sum(t.data.nbytes if isinstance(t, PackedTensor) else t.nbytes for t in tensors)


def timed(launch) -> float:
    launch()
    if not TINY:
        torch.cuda.synchronize()
    return time_us(launch, device=DEVICE, warmup_ms=1 if TINY else 25, rep_ms=1 if TINY else 100)


def narrow_specs(k: int, top: int, int32: bool, derived: str) -> list[RequantizedOutput]:
    """The stored u8 mid (ReLU) and a derived u8 at 0.8 of its scale or a derived u2."""
    g = torch.Generator().manual_seed(3)
    ra = torch.rand(k, generator=g, dtype=torch.float64) * 1e-3 + 1e-4
    rb = torch.rand(k, generator=g, dtype=torch.float64) * 0.5 + 0.1
    m, r, s = fixed_point_pair32(ra, rb, top, 255, 2.0) if int32 else fixed_point_pair(ra, rb)
    b = ((torch.rand(k, generator=g, dtype=torch.float64) - 0.5) * torch.pow(2.0, s)).long()
    table = (LEVELS // 64) if derived == "u2" else torch.round(LEVELS * 0.8 + 3).long().clamp(
        0, 255)
    return [RequantizedOutput(U8, m, s, r, True, bias=b),
            RequantizedOutput(derived, m, s, r, True, mid=U8, table=table, bias=b)]


def wide_specs(k: int) -> list[K.Requantized]:
    g = torch.Generator().manual_seed(3)
    out = []
    for prec, relu in ((U8, True), (S24, False)):
        ratio = torch.rand(k, generator=g, dtype=torch.float64) * 1e-3 + 1e-4
        rr = torch.rand(k, generator=g, dtype=torch.float64) * 0.5 + 0.1
        m, r, s = fixed_point_pair(ratio, rr)
        out.append(K.Requantized(prec, m, s, None, r, relu=relu))
    return out


def compiled_regs(launch) -> dict:
    if TINY:
        return {}
    s = launch.launches[0]
    compiled = s.fn.warmup(*s.args, grid=s.grid, **s.kwargs)
    compiled._init_handles()  # loads the binary: fills n_regs / n_spills
    return {"regs": compiled.n_regs, "spills": compiled.n_spills}


def block_end_rows(bandwidth: float, int8_peak: float) -> list[dict]:
    wl = BLOCK_END
    x, w, params = random_inputs_for(wl)
    kernel = CONV2D_INT8.build(wl, CONV2D_INT8.default_config(wl))
    shape = (wl.N, wl.P, wl.Q, wl.K)
    g = torch.Generator(device=DEVICE).manual_seed(2)
    res_wide = PackedTensor(torch.randint(-(2**23), 2**23, shape, generator=g, device=DEVICE,
                                          dtype=torch.int32), shape, S24, INT8)
    res_u8 = PackedTensor(torch.randint(0, 256, shape, generator=g, device=DEVICE,
                                        dtype=torch.uint8), shape, U8, INT8)
    acc = torch.empty(shape, dtype=torch.int32, device=DEVICE)
    conv = kernel.bind(x, w, params, acc)
    rows: list[dict] = []

    def row(path: str, us: float, moved: int, **extra) -> None:
        floor = floor_us(wl.ops, moved, int8_peak, bandwidth)
        rows.append({"layer": "resnet50_layer1_conv3", "N": wl.N, "path": path, "us": us,
                     "bytes": moved, "floor_us": floor, "x_floor": us / floor, **extra})
        print({k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()},
              flush=True)

    def outs_of(specs, layouts):
        return [K.empty_packed(shape, sp.precision, lay, DEVICE)
                for sp, lay in zip(specs, layouts, strict=True)]

    row("conv int32 alone", timed(conv), nbytes(x, w, acc))
    # today's wide path: separate, then fused
    wide = wide_specs(wl.K)
    ref = outs_of(wide, (INT8, INT8))
    pass_launch = K.bind_layer_epilogue(acc, wide, ref, res_wide, acc_bound(wl))

    io = nbytes(x, w, res_wide, *ref)
    row("wide: kernel int32 + pass", timed(both(conv, pass_launch)), io + 2 * nbytes(acc),
        kernel_us=timed(conv), pass_us=timed(pass_launch))
    got = outs_of(wide, (INT8, INT8))
    fused = bind_conv_outputs(kernel, x, w, params, wide, got, res_wide)
    row("wide: fused", timed(fused), io, exact=same(got, ref), **compiled_regs(fused))
    # the narrow block end
    top = acc_bound(wl)
    for derived, layout in (("u8", INT8), ("u2", BITPLANE)):
        for int32 in (False, True):
            specs = narrow_specs(wl.K, top, int32, derived)
            ref = outs_of(specs, (INT8, layout))
            name = f"narrow u8 + derived {derived}, {'int32' if int32 else 'float64'}"
            pass_launch = K.bind_layer_epilogue(acc, specs, ref, res_u8, top)

            io = nbytes(x, w, res_u8, *ref)
            row(f"{name}: kernel int32 + pass", timed(both(conv, pass_launch)),
                io + 2 * nbytes(acc),
                mode=pass_launch.launches[0].kwargs["MODE0"],
                exact_reference=pass_matches_reference(acc, specs, ref, res_u8))
            tiles = TILES if derived == "u8" else [tuple(FUSED_TILE.values())]
            for bm, bn, warps in tiles:
                tile = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)
                got = outs_of(specs, (INT8, layout))
                try:
                    fused = bind_conv_outputs(kernel, x, w, params, specs, got, res_u8,
                                              tile=tile)
                    row(f"{name}: fused", timed(fused), io, tile=tile, exact=same(got, ref),
                        mode=fused.launches[0].kwargs["MODE0"], **compiled_regs(fused))
                except Exception as e:  # one tile's failure must not end the probe
                    rows.append({"path": f"{name}: fused", "tile": tile,
                                 "error": f"{type(e).__name__}: {e}"[:300]})
                    print(rows[-1], flush=True)
    return rows


def both(first, second):
    """A launcher running `first` then `second`."""
    def run_both() -> None:
        first()
        second()

    return run_both


def random_inputs_for(wl):
    from lowbit.reference import random_inputs

    return random_inputs(wl, seed=1, device=DEVICE)


def same(got, ref) -> bool:
    return all(torch.equal(a.data, b.data) for a, b in zip(got, ref, strict=True))


def pass_matches_reference(acc, specs, outs, residual) -> bool:
    """The pass's outputs on the first two images equal `reference.epilogue_outputs`."""
    from lowbit.quant.packing import unpack

    y = acc[:2].to(torch.int64)
    res = residual.data[:2].to(torch.int64)
    for out, want in zip(outs, epilogue_outputs(y, None, specs, residual=res), strict=True):
        got = unpack(out.data.cpu(), out.precision, out.layout, out.shape[-1])[:2]
        if not torch.equal(got, want.cpu()):
            return False
    return True


def pointwise_rows(bandwidth: float, int8_peak: float) -> list[dict]:
    rows = []
    base = POINTWISE
    g = torch.Generator().manual_seed(5)
    ratio = torch.rand(base.K, generator=g, dtype=torch.float64) * 2e-3 + 1e-4
    for name in ("int32 output", "u8 float64", "u8 int32"):
        if name == "int32 output":
            wl = base.replace(epilogue=Epilogue())
            x, w, params = random_inputs_for(wl)
        else:
            wl = base.replace(epilogue=Epilogue(relu=True, out="u8", shifted_bias=True))
            x, w, _ = random_inputs_for(wl)
            if name == "u8 int32":
                m, _, s = fixed_point_pair32(ratio, 0.0, acc_bound(wl), 0, 2.0)
            else:
                m, _, s = fixed_point_pair(ratio, 0.0)
            b = ((torch.rand(base.K, generator=g, dtype=torch.float64) - 0.5)
                 * torch.pow(2.0, s)).long()
            params = EpilogueParams(multiplier=m.to(torch.int32).to(DEVICE),
                                    shift=s.to(torch.int32).to(DEVICE),
                                    shifted_bias=b.to(DEVICE))
        kernel = CONV2D_INT8.build(wl, CONV2D_INT8.default_config(wl))
        # the epilogue's HAS_BIAS (3 float64, 4 int32) as the kernel's bind picks it
        has_bias = with_float64_requant(wl, kernel.problem, params, (None,) * 4, DEVICE)[0].bias
        want = run(wl, x, w, params)
        out = torch.empty_like(want)
        launch = kernel.bind(x, w, params, out)
        us = timed(launch)
        moved = nbytes(x, w, out)
        floor = floor_us(wl.ops, moved, int8_peak, bandwidth)
        rows.append({"layer": "mobilenetv2_pw_24to144", "N": wl.N, "path": name, "us": us,
                     "bytes": moved, "floor_us": floor, "x_floor": us / floor,
                     "exact": bool(torch.equal(out, want)), "has_bias": has_bias,
                     "config": dict(kernel.config)})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    if not TINY and not torch.cuda.is_available():
        sys.exit("block_end_probe needs a CUDA GPU (or --tiny on the CPU)")
    peaks = H100 if TINY else gpu_spec_for(torch.cuda.get_device_name())
    bandwidth = peaks.bandwidth if TINY else measure_bandwidth()
    rows = [{"path": "copy bandwidth", "bytes_per_s": bandwidth, "int8_peak": peaks.int8}]
    rows += pointwise_rows(bandwidth, peaks.int8)
    write_probe("block_end_probe", rows)
    rows += block_end_rows(bandwidth, peaks.int8)
    print(write_probe("block_end_probe", rows))


if __name__ == "__main__":
    main()
