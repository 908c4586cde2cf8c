"""GPU benchmark of the engine's network ops: the fused first layer (lowbit.kernels.triton.stem)
and the packed-domain pools, layer epilogue and image quantization (.netops), each against its
roofline floor and the PyTorch fp16 ops a user would run instead (channels_last,
cudnn.benchmark, eager and under CUDA-graph replay), all in the same run; and the classifier
GEMM (N = 1000) on the int8 GEMM template's default config against torch fp16 matmul.

    python benchmarks/netops.py [--out DIR] [--batches 8 256] [--quick]

Rows (results file "benchmark": "netops"): {op, workload, batch, impl, config, time_us,
graph_us, floor_us, exact, baselines_us: {fp16_eager, fp16_cuda_graph}}. The floor is
max(ops / int8 tensor-core rate, bytes / DRAM bandwidth) with the rates measured in
docs/design.md (section 5, "Hardware facts"); bytes = the op's inputs as stored + its outputs
as stored. Each case runs on its own: a failure is recorded in its row and the run goes on. A
short table ends the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_results
from lowbit.core import ConvWorkload, Layout, PackedTensor, Precision
from lowbit.kernels.timing import time_us
from lowbit.quant.packing import pack
from lowbit.reference import (
    RequantizedOutput,
    accumulate,
    avgpool_multiplier,
    epilogue_outputs,
    fixed_point_pair,
    maxpool2d_int,
    quantize_float,
)

INT8_OPS = 1158e12  # Triton int8 dot, 8192^3 (docs/design.md, "Hardware facts")
DRAM_BPS = 3.0e12  # device-to-device copy, bytes read + written (the same table)
INT8, BITPLANE = Layout.INT8, Layout.BITPLANE


def floor_us(ops: float, nbytes: float) -> float:
    return max(ops / INT8_OPS, nbytes / DRAM_BPS) * 1e6


def nbytes(*ts) -> int:
    total = 0
    for t in ts:
        t = t.data if isinstance(t, PackedTensor) else t
        total += t.numel() * t.element_size()
    return total


def timed(fn) -> tuple[float, float]:
    """(eager median us with L2 flushed, CUDA-graph replay median us)."""
    fn()
    torch.cuda.synchronize()
    return time_us(fn), time_us(fn, cuda_graph=True)


# --------------------------------------------------------------------------- stem
def stem_case(batch: int, dtype: torch.dtype, seed: int = 0):
    from lowbit.kernels.triton import stem as S

    g = torch.Generator().manual_seed(seed)
    image = (torch.randn(batch, 3, 224, 224, generator=g) * 1.5).to(dtype)
    weight = torch.randint(-128, 128, (64, 7, 7, 3), generator=g)
    bias = torch.randint(-20000, 20000, (64,), generator=g)
    specs = []
    for prec in ("u8", "u2"):  # layer1's residual (wide) and its bit-serial conv's planes
        m, _, s = fixed_point_pair(torch.rand(64, generator=g, dtype=torch.float64) * 4e-4
                                   + 2e-5, 0.0)
        specs.append(RequantizedOutput(prec, m, s, relu=True))
    geom = S.geometry_of(image, weight, 2, 3, 1)
    return image, weight, bias, specs, geom


def stem_reference(image, weight, bias, specs, scale) -> list[torch.Tensor]:
    q = quantize_float(image.cuda(), scale, "s8").permute(0, 2, 3, 1).contiguous()
    wl = ConvWorkload(N=q.shape[0], H=224, W=224, C=3, K=64, R=7, S=7, stride=2, pad=3)
    acc = accumulate(wl, q, weight.cuda())
    return [maxpool2d_int(o, 3, 2, 1) for o in epilogue_outputs(acc, bias.cuda(), specs)]


def fp16_stem_baseline(batch: int) -> tuple[float, float]:
    """cuDNN fp16 conv 7x7/2 + BatchNorm (eval) + ReLU + max-pool 3x3/2, channels_last."""
    torch.backends.cudnn.benchmark = True
    conv = torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False)
    bn = torch.nn.BatchNorm2d(64)
    model = torch.nn.Sequential(conv, bn, torch.nn.ReLU(inplace=True),
                                torch.nn.MaxPool2d(3, 2, 1)).cuda().half().eval()
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last)
    with torch.no_grad():
        return timed(lambda: model(x))


#: stem launch variants timed beside the default config (StemConfig fields changed)
STEM_VARIANTS = [{}, {"maxnreg": 168}, {"maxnreg": 128}, {"whole_k": False},
                 {"block_n": 32}, {"images": 2, "num_warps": 8}]


def stem_rows(batch: int, quick: bool) -> list[dict]:
    from lowbit.kernels.triton import stem as S
    from lowbit.kernels.triton.stored import Launcher

    rows = []
    base = fp16_stem_baseline(batch)
    variants = STEM_VARIANTS if not quick else STEM_VARIANTS[:1]
    for dtype in (torch.float32, torch.float16):
        image, weight, bias, specs, geom = stem_case(batch, dtype)
        img = image.cuda()
        ref = stem_reference(img, weight, bias, specs, 0.03) if batch <= 64 else None
        default = S.default_config(geom)
        configs = [dataclasses.replace(default, **v) for v in variants]
        if dtype == torch.float32 and not quick:  # the band lengths around the default
            configs += [dataclasses.replace(default, band_rows=b) for b in (1, 4, 8)
                        if b != default.band_rows]
        else:
            configs = configs[:1]
        for cfg in configs:
            row = dict(op="stem", workload=f"resnet_stem_224_{str(dtype)[6:]}",
                       batch=batch, impl="triton.stem", config=cfg.__dict__,
                       baselines_us={"fp16_eager": base[0], "fp16_cuda_graph": base[1]})
            try:
                outs = [S.empty_packed(geom.out_shape, s.precision, lay, "cuda")
                        for s, lay in zip(specs, (INT8, BITPLANE), strict=True)]
                launch = S.bind_stem(img, weight, bias, specs, outs, stride=2, pad=3,
                                     pool_pad=1, scale=0.03, config=cfg)
                launch()
                if ref is not None:
                    row["exact"] = all(
                        torch.equal(o.data, pack(v, o.precision, o.layout))
                        for o, v in zip(outs, ref, strict=True))
                row["time_us"], row["graph_us"] = timed(launch)
                row["parts_us"] = [time_us(Launcher((part,), ()))
                                   for part in launch.launches]
                row["floor_us"] = floor_us(2 * geom.macs, nbytes(img, *outs))
            except Exception as e:  # one failed case must not end the run
                row["error"] = f"{type(e).__name__}: {e}"[:500]
                traceback.print_exc()
            rows.append(row)
    return rows


# --------------------------------------------------------------------------- pools etc.
def packed_random(shape, prec: str, layout: Layout, seed: int) -> tuple[PackedTensor, torch.Tensor]:
    p = Precision.parse(prec)
    g = torch.Generator().manual_seed(seed)
    v = torch.randint(p.qmin, p.qmax + 1, shape, generator=g)
    return PackedTensor(pack(v, p, layout).cuda(), tuple(shape), p, layout), v


def op_rows(batch: int) -> list[dict]:
    from lowbit.kernels.triton import netops as K

    rows: list[dict] = []

    def run(op, workload, make, ref_fn, fp16_fn):
        row = dict(op=op, workload=workload, batch=batch, impl="triton.netops", config={})
        try:
            launch, ins, outs = make()
            launch()
            if ref_fn is not None:
                row["exact"] = bool(ref_fn(outs))
            row["time_us"], row["graph_us"] = timed(launch)
            row["floor_us"] = floor_us(0, nbytes(*ins, *outs))
            row["baselines_us"] = dict(zip(("fp16_eager", "fp16_cuda_graph"), timed(fp16_fn),
                                           strict=True))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:500]
            traceback.print_exc()
        rows.append(row)

    # max-pool of the stem's output map (standalone: a network's other pools)
    for prec, layout in (("u8", INT8), ("u2", BITPLANE)):
        x, xv = packed_random((batch, 112, 112, 64), prec, layout, 1)
        out = K.empty_packed((batch, 56, 56, 64), prec, layout, "cuda")
        xf = torch.randn(batch, 64, 112, 112, device="cuda", dtype=torch.float16).to(
            memory_format=torch.channels_last)
        small = batch <= 8
        run("maxpool", f"112x112x64_{prec}_{layout.value}",
            lambda x=x, out=out: (K.bind_maxpool2d(x, out, 3, 2, 1), [x], [out]),
            (lambda o, out=out, xv=xv: torch.equal(
                out.data.cpu(), pack(maxpool2d_int(xv, 3, 2, 1), out.precision, out.layout)))
            if small else None,
            lambda xf=xf: F.max_pool2d(xf, 3, 2, 1))
    # global average pool before the classifier (ResNet-50: 7x7x2048)
    x, xv = packed_random((batch, 7, 7, 2048), "u8", INT8, 2)
    m, s = avgpool_multiplier(49, 0.05, 0.04)
    out = K.empty_packed((batch, 1, 1, 2048), "s8", INT8, "cuda")
    xf = torch.randn(batch, 2048, 7, 7, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last)
    from lowbit.reference import avgpool2d_int
    run("global_avgpool", "7x7x2048_u8_to_s8",
        lambda: (K.bind_avgpool2d(x, out, None, None, 0, m, s), [x], [out]),
        lambda o: torch.equal(out.data.cpu(), pack(avgpool2d_int(xv, None, None, 0, m, s, "s8"),
                                                   out.precision, INT8)),
        lambda: F.adaptive_avg_pool2d(xf, 1))
    # block-ending layer epilogue: int32 y + u8 residual -> u8 (wide) + u2 bit planes
    shape = (batch, 56, 56, 256)
    g = torch.Generator().manual_seed(3)
    y = torch.randint(-60000, 60000, shape, generator=g, dtype=torch.int32).cuda()
    res, _ = packed_random(shape, "u8", INT8, 4)
    specs = []
    for prec in ("u8", "u2"):
        mm, r, ss = fixed_point_pair(torch.rand(256, generator=g, dtype=torch.float64) * 3e-3,
                                     0.2)
        specs.append(RequantizedOutput(prec, mm, ss, r, relu=True))
    outs = [K.empty_packed(shape, sp.precision, lay, "cuda")
            for sp, lay in zip(specs, (INT8, BITPLANE), strict=True)]
    yf = torch.randn(batch, 256, 56, 56, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last)
    rf = torch.randn_like(yf)
    run("layer_epilogue", "56x56x256_res_u8_to_u8+u2",
        lambda: (K.bind_layer_epilogue(y, specs, outs, res), [y, res], outs),
        None, lambda: torch.relu(yf + rf))
    # image quantization alone (what the stem's first launch does, without space-to-depth)
    img = torch.randn(batch, 3, 224, 224, device="cuda")
    qout = K.empty_packed((batch, 224, 224, 3), "s8", INT8, "cuda")
    run("quantize_image", "224x224x3_fp32_to_s8",
        lambda: (K.bind_quantize_image(img, 0.03, qout), [img], [qout]),
        lambda o: torch.equal(qout.data, quantize_float(img, 0.03, "s8").permute(
            0, 2, 3, 1).to(torch.int8)),
        lambda: img.half())
    return rows


# --------------------------------------------------------------------------- classifier
def fc_rows(batch: int) -> list[dict]:
    """The classifier GEMM (N = 1000) on the existing int8 GEMM template's default config
    (fp16 output, scale fused) against torch fp16 matmul: where the FC path stands."""
    from lowbit.core import Epilogue, GemmWorkload
    from lowbit.kernels.triton import GEMM_INT8
    from lowbit.reference import random_inputs

    rows = []
    for k in (512, 2048, 4096, 9216):
        wl = GemmWorkload(M=batch, N=1000, K=k, epilogue=Epilogue(bias=True, out="fp16"))
        cfg = GEMM_INT8.default_config(wl)
        row = dict(op="fc", workload=f"fc_{batch}x1000x{k}", batch=batch,
                   impl="triton.gemm_int8", config=dict(cfg))
        try:
            x, w, params = random_inputs(wl, 5, device="cuda")
            launch = GEMM_INT8.build(wl, cfg).bind(x, w, params)
            a = torch.randn(batch, k, device="cuda", dtype=torch.float16)
            b = torch.randn(1000, k, device="cuda", dtype=torch.float16)
            row["time_us"], row["graph_us"] = timed(launch)
            row["floor_us"] = floor_us(2 * batch * 1000 * k, nbytes(x, w) + batch * 2000)
            row["baselines_us"] = dict(zip(("fp16_eager", "fp16_cuda_graph"),
                                           timed(lambda a=a, b=b: a @ b.T), strict=True))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:500]
            traceback.print_exc()
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- main
def print_table(rows: list[dict]) -> None:
    print(f"\n{'op':16s} {'workload':28s} {'batch':>5s} {'config':24s} {'us':>8s} {'graph':>8s}"
          f" {'floor':>7s} {'x floor':>7s} {'fp16':>8s} {'fp16 cg':>8s} exact")
    for r in rows:
        cfg = ",".join(f"{k[:5]}={v}" for k, v in r.get("config", {}).items()
                       if k in ("band_rows", "whole_k", "block_n", "images", "maxnreg",
                                "SPLIT_K"))
        if "parts_us" in r:
            cfg += " [" + "+".join(f"{p:.0f}" for p in r["parts_us"]) + "]"
        if "error" in r:
            print(f"{r['op']:16s} {r['workload']:28s} {r['batch']:5d} {cfg:24s} "
                  f"ERROR {r['error'][:60]}")
            continue
        b = r.get("baselines_us", {})
        print(f"{r['op']:16s} {r['workload']:28s} {r['batch']:5d} {cfg:24s} "
              f"{r['time_us']:8.1f} {r['graph_us']:8.1f} {r['floor_us']:7.1f} "
              f"{r['time_us'] / r['floor_us']:7.2f} {b.get('fp16_eager', 0):8.1f} "
              f"{b.get('fp16_cuda_graph', 0):8.1f} {r.get('exact', '-')}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="results folder")
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 256])
    ap.add_argument("--quick", action="store_true", help="one stem config per batch")
    ap.add_argument("--skip", nargs="*", default=[], choices=["stem", "ops", "fc"])
    args = ap.parse_args()
    if args.out is not None:
        os.environ["LOWBIT_RESULTS_DIR"] = str(args.out)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    rows: list[dict] = []
    for batch in args.batches:
        for name, fn in (("stem", lambda b=batch: stem_rows(b, args.quick)),
                         ("ops", lambda b=batch: op_rows(b)), ("fc", lambda b=batch: fc_rows(b))):
            if name in args.skip:
                continue
            try:
                rows += fn()
            except Exception as e:  # a whole group failing is recorded too
                rows.append(dict(op=name, workload="-", batch=batch,
                                 error=f"{type(e).__name__}: {e}"[:500]))
                traceback.print_exc()
    path = write_results("netops", rows)
    print_table(rows)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
