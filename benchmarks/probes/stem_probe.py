"""The fused first layer's kernels timed side by side (GPU): on ResNet's 7x7/2 + pool the
default "bands" kernel, the one-launch "ring" kernel over their knobs (and one "gemm"
config) and the warp-specialized CUDA kernel ("ws", `--variants ws "ws band /2" "ws band 8"`
times it alone against the default), on AlexNet's and VGG's first layers the "gemm" sweep;
cuDNN fp16 conv + ReLU (+ max-pool) on the same shapes, in one run. It ends with the fastest
exact variant per geometry, input and batch against the default: which kernel
`stem.default_config` should pick.

First-layer geometries (`--stems`; 224 x 224 image, C=3, K=64): ResNet-18/50's 7x7/2 pad 3
with the 3x3/2 pool pad 1, AlexNet's 11x11/4 pad 2 with the pool pad 0, VGG's 3x3/1 pad 1
without pool; images float32 (with the non-finite status flag, as the network binds it) and /
or uint8 pixels with the ImageNet normalization's table (`--inputs`); the outputs
(`--outputs`, default one u2 in BITPLANE: ResNet-50's conv1 in the w1a2 / w2a2 networks; u8
goes to INT8; `u8 u2@u8`: ResNet-18's narrow stream and its derived u2 reading); batch 8 and
256. Every variant's outputs are checked bit for bit against the default's (and, at batch
<= 16, against `lowbit.reference`). Times: CUDA-graph replay median (`kernels.timing.time_us`,
which repeats well over 20 times), the whole stem and, for two-launch variants, each launch
alone; first_call_s: the first call's wall time (mostly Triton's compile). floor_us: the
network bench's roofline (`lowbit.bench.timing`: max(ops / int8 peak, bytes / DRAM bandwidth), ops =
2 x the conv's MACs at its own R x R x C taps, bytes = image as given + weights + outputs as
stored). One failing variant is recorded in its row and the run goes on. The default ResNet
run (2 inputs x 2 batches, 16 variants: ~20 compiles) is meant to take ~3 minutes on an
H100; `--full` adds the rest of the ring knobs.

    python benchmarks/probes/stem_probe.py [--out DIR] [--batches 8 256] [--quick] [--full] \
        [--stems resnet alexnet vgg] [--inputs float32 uint8] [--outputs u2]
    python benchmarks/probes/stem_probe.py --sass   # no GPU: the ws kernel's SASS per step

Writes stem_probe-<time>.json (rows with "benchmark": "stem_probe", "winners") and .txt (the
table and the winners) to DIR (default benchmarks/results/<gpu>/logs/).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import ROOT, gpu_dirname, gpu_name, versions
from lowbit.bench import BANDWIDTH, PEAK_OPS
from lowbit.core import ConvWorkload, Layout, Precision
from lowbit.kernels.timing import time_us
from lowbit.kernels.triton import stem as S
from lowbit.kernels.triton.stored import Launcher
from lowbit.quant.packing import pack
from lowbit.reference import (
    RequantizedOutput,
    accumulate,
    epilogue_outputs,
    fixed_point_pair,
    maxpool2d_int,
    quantize_float,
    quantize_uint8_image,
    uint8_input_table,
)

INT8, BITPLANE = Layout.INT8, Layout.BITPLANE
SCALE = 0.03
SMS = 132
#: torchvision's ImageNet normalization (the uint8 input's table)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def gemm_config(geom: S.StemGeometry, block_j: int = 64, per_sm: int = 2,
                **knobs) -> S.StemConfig:
    """A "gemm" config whose band is the longest that still gives every SM `per_sm` programs
    (`stem.gemm_band_rows`; band_rows in knobs overrides)."""
    rows = S.gemm_band_rows(geom, block_j, knobs.get("block_n", 64), SMS, per_sm)
    base = dict(kernel="gemm", block_j=block_j, band_rows=rows, whole_k=True, num_warps=8,
                num_stages=2)
    return S.StemConfig(**{**base, **knobs})


#: (name, config maker): the gemm sweep around its suggested config
SWEEP = [
    ("gemm j64 wk s2 w8", lambda g: gemm_config(g)),
    ("gemm j64 wk s1 w8", lambda g: gemm_config(g, num_stages=1)),
    ("gemm j64 wk s3 w8", lambda g: gemm_config(g, num_stages=3)),
    ("gemm j64 wk s2 w4", lambda g: gemm_config(g, num_warps=4)),
    ("gemm j64 k64 s3 w8", lambda g: gemm_config(g, whole_k=False, num_stages=3)),
    ("gemm j64 wk s2 w8 n32", lambda g: gemm_config(g, block_n=32)),
    ("gemm j64 wk s2 w8 band x2", lambda g: gemm_config(
        g, band_rows=2 * gemm_config(g).band_rows)),
    ("gemm j64 wk s2 w8 band x4", lambda g: gemm_config(
        g, band_rows=4 * gemm_config(g).band_rows)),
    ("gemm j64 wk s2 w8 band /2", lambda g: gemm_config(
        g, band_rows=max(1, gemm_config(g).band_rows // 2))),
    ("gemm j32 wk s2 w4", lambda g: gemm_config(g, block_j=32, num_warps=4)),
    ("gemm j32 wk s3 w4", lambda g: gemm_config(g, block_j=32, num_warps=4, num_stages=3)),
    ("gemm j32 k64 s3 w4", lambda g: gemm_config(g, block_j=32, num_warps=4, whole_k=False,
                                                  num_stages=3)),
    ("gemm j16 wk s2 w4", lambda g: gemm_config(g, block_j=16, num_warps=4)),
    ("bands j32", lambda g: dataclasses.replace(S.default_config(g), block_j=32)),
    # more, shorter programs (AlexNet at batch 8: 112 programs of the default on 132 SMs)
    ("bands j32 band 1", lambda g: S.StemConfig(block_j=32, band_rows=1, whole_k=True)),
    ("bands j16 band 1", lambda g: S.StemConfig(block_j=16, band_rows=1, whole_k=True)),
    ("bands j32 n32 band 1", lambda g: S.StemConfig(block_j=32, block_n=32, band_rows=1,
                                                    whole_k=True)),
    ("bands j16 n32 band 2", lambda g: S.StemConfig(block_j=16, block_n=32, band_rows=2,
                                                    whole_k=True)),
    ("gemm j16 wk s2 w4 band 1", lambda g: gemm_config(g, block_j=16, num_warps=4,
                                                        band_rows=1)),
]


def bands_config(geom: S.StemGeometry, **knobs) -> S.StemConfig:
    """The "bands" kernel at the default's knobs (`stem.default_config` on ResNet's 7x7/2),
    `knobs` overriding; band_rows scaled by `band_scale` (2: twice, 0.5: half)."""
    base = S.default_config(geom, SMS)
    if base.kernel != "bands":
        base = S.StemConfig(band_rows=2, whole_k=True)
    scale = knobs.pop("band_scale", 1)
    rows = max(1, int(base.band_rows * scale))
    return dataclasses.replace(base, band_rows=rows, **knobs)


def ring_config(geom: S.StemGeometry, **knobs) -> S.StemConfig:
    """`stem.ring_config` with `knobs`; band_rows scaled by `band_scale`."""
    scale = knobs.pop("band_scale", 1)
    if scale != 1:
        knobs["band_rows"] = max(1, int(S.ring_config(geom, SMS, **knobs).band_rows * scale))
    return S.ring_config(geom, SMS, **knobs)


#: (name, config maker): ResNet's 7x7/2 + pool, the "bands" kernel (the default) and the "ring"
#: kernel over their knobs. Knobs that change no constexpr (band_rows, programs_per_sm) cost
#: no compile; the rest one each per input dtype (~3-5 s).
RESNET_SWEEP = [
    ("bands band x2", lambda g: bands_config(g, band_scale=2)),
    ("bands band /2", lambda g: bands_config(g, band_scale=0.5)),
    ("bands 2 images", lambda g: bands_config(g, images=2)),
    ("bands n32", lambda g: bands_config(g, block_n=32)),
    ("bands w8", lambda g: bands_config(g, num_warps=8)),
    ("bands w8 band x2", lambda g: bands_config(g, num_warps=8, band_scale=2)),
    ("ring j32 w4 2/SM", lambda g: ring_config(g)),
    ("ring early loads", lambda g: ring_config(g, late_loads=False)),
    ("ring 1/SM", lambda g: ring_config(g, programs_per_sm=1)),
    ("ring 3/SM", lambda g: ring_config(g, programs_per_sm=3)),
    ("ring band /2", lambda g: ring_config(g, band_scale=0.5)),
    ("ring band x2", lambda g: ring_config(g, band_scale=2)),
    ("ring j16 4/SM", lambda g: ring_config(g, block_j=16, programs_per_sm=4)),
    ("ring j64 w8", lambda g: ring_config(g, block_j=64, num_warps=8)),
    ("ring n32 3/SM", lambda g: ring_config(g, block_n=32, programs_per_sm=3)),
    ("ring untransposed", lambda g: ring_config(g, transposed=False)),
    ("gemm j16 wk s2 w4", lambda g: gemm_config(g, block_j=16, num_warps=4)),
    *(WS_SWEEP := [
        # the warp-specialized CUDA kernel (kernels/cuda/stem_ws.py): its band, the only knob
        ("ws", lambda g: S.ws_config(g, SMS)),
        ("ws band /2", lambda g: S.ws_config(g, SMS, band_rows=max(
            1, S.ws_config(g, SMS).band_rows // 2))),
        ("ws band 8", lambda g: S.ws_config(g, SMS, band_rows=8)),
    ]),
]
#: `--quick`: the default, the ring kernel's default and two of its variants, the ws kernel
QUICK = ("ring j32 w4 2/SM", "ring early loads", "ring j64 w8", "ws")
#: the rest of the ring knobs (`--full`)
RING_EXTRA = [
    ("ring float64 requant", lambda g: ring_config(g, thresholds=False)),
    ("ring maxnreg 168 3/SM", lambda g: ring_config(g, maxnreg=168, programs_per_sm=3)),
    ("ring j32 w8", lambda g: ring_config(g, num_warps=8)),
    ("ring j64 w8 untransposed", lambda g: ring_config(g, block_j=64, num_warps=8,
                                                       transposed=False)),
    ("gemm j32 wk s2 w4", lambda g: gemm_config(g, block_j=32, num_warps=4)),
]


#: first layers by network: (filter size, stride, pad, pool_pad: the 3x3/2 max-pool's padding,
#: None without a pool), 3 -> 64 channels on a 224 x 224 image
STEMS = {"resnet": (7, 2, 3, 1), "alexnet": (11, 4, 2, 0), "vgg": (3, 1, 1, None)}


def make_case(batch: int, stem: str = "resnet", seed: int = 0, inputs: str = "float32",
              outputs: tuple[str, ...] = ("u2",)):
    """(image, weight, bias, specs, geometry, input kwargs of bind_stem) on the GPU."""
    r, stride, pad, pool_pad = STEMS[stem]
    g = torch.Generator().manual_seed(seed)
    if inputs == "uint8":
        image = torch.randint(0, 256, (batch, 3, 224, 224), generator=g, dtype=torch.uint8)
        kw = dict(table=uint8_input_table(SCALE, "s8", MEAN, STD))
    else:
        image = torch.randn(batch, 3, 224, 224, generator=g) * 1.5
        kw = dict(scale=SCALE)
    image = image.cuda()
    weight = torch.randint(-128, 128, (64, r, r, 3), generator=g)
    bias = torch.randint(-20000, 20000, (64,), generator=g)
    specs, formulas = [], {}
    for prec in outputs:
        if "@" in prec:  # a derived reading of an earlier output's value (its formula)
            out, mid = (Precision.parse(p) for p in prec.split("@"))
            m, s = formulas[str(mid)]
            v = torch.arange(mid.qmin, mid.qmax + 1, dtype=torch.float64)
            table = (v * 0.06 + 0.5).floor().clamp(out.qmin, out.qmax).to(torch.int64)
            specs.append(RequantizedOutput(out, m, s, relu=True, mid=mid, table=table))
            continue
        m, _, s = fixed_point_pair(torch.rand(64, generator=g, dtype=torch.float64) * 4e-4
                                   + 2e-5, 0.0)
        formulas[prec] = (m, s)
        specs.append(RequantizedOutput(prec, m, s, relu=True))
    return image, weight, bias, specs, S.geometry_of(image, weight, stride, pad, pool_pad), kw


def layout_of(prec: object) -> Layout:
    return BITPLANE if str(prec) in ("u1", "u2", "s2", "u4") else INT8


def reference_outputs(image, weight, bias, specs, geom: S.StemGeometry, kw: dict
                      ) -> list[torch.Tensor]:
    q = (quantize_uint8_image(image, kw["table"]) if "table" in kw
         else quantize_float(image, SCALE, "s8")).permute(0, 2, 3, 1).contiguous()
    wl = ConvWorkload(N=q.shape[0], H=224, W=224, C=3, K=64, R=geom.R, S=geom.R,
                      stride=geom.stride, pad=geom.pad)
    acc = accumulate(wl, q, weight.cuda())
    outs = epilogue_outputs(acc, bias.cuda(), specs)
    if geom.pool_pad is None:
        return outs
    return [maxpool2d_int(o, 3, 2, geom.pool_pad) for o in outs]


def floor_us(geom: S.StemGeometry, image: torch.Tensor, outs) -> float:
    nbytes = image.numel() * image.element_size() + geom.K * geom.R * geom.R * geom.C
    nbytes += sum(o.data.numel() * o.data.element_size() for o in outs)
    return max(2.0 * geom.macs / PEAK_OPS["int8"], nbytes / BANDWIDTH) * 1e6


def cudnn_us(batch: int, geom: S.StemGeometry) -> float:
    """cuDNN fp16 conv (channels_last, cudnn.benchmark) + ReLU (+ the 3x3/2 max-pool) of the
    geometry, CUDA-graph replay median."""
    torch.backends.cudnn.benchmark = True
    x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last)
    w = torch.randn(64, 3, geom.R, geom.R, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last)

    def fn():
        y = F.relu(F.conv2d(x, w, stride=geom.stride, padding=geom.pad))
        return y if geom.pool_pad is None else F.max_pool2d(y, 3, 2, geom.pool_pad)

    fn()
    torch.cuda.synchronize()
    return time_us(fn, cuda_graph=True)


def run_variant(name: str, cfg: S.StemConfig, case, want, ref) -> dict:
    image, weight, bias, specs, geom, kw = case
    row = {"benchmark": "stem_probe", "stem": f"{geom.R}x{geom.R}/{geom.stride}",
           "batch": geom.N, "input": str(image.dtype).replace("torch.", ""),
           "outputs": [str(s.precision) for s in specs], "variant": name,
           "config": dataclasses.asdict(cfg)}
    try:
        outs = [S.empty_packed(geom.out_shape, s.precision, layout_of(s.precision), "cuda")
                for s in specs]
        for o in outs:
            o.data.fill_(0x5A)
        status = None if "table" in kw else torch.zeros(1, dtype=torch.int32, device="cuda")
        launch = S.bind_stem(image, weight, bias, specs, outs, stride=geom.stride,
                             pad=geom.pad, pool_pad=geom.pool_pad, config=cfg, status=status,
                             **kw)
        t0 = time.perf_counter()
        launch()
        torch.cuda.synchronize()
        row["first_call_s"] = time.perf_counter() - t0  # mostly Triton's compile
        have = [o.data.clone() for o in outs]
        if want is not None:
            row["exact_vs_default"] = all(torch.equal(a, b) for a, b in zip(have, want,
                                                                              strict=True))
        if ref is not None:
            row["exact_vs_reference"] = all(
                torch.equal(o.data, pack(v, o.precision, o.layout))
                for o, v in zip(outs, ref, strict=True))
        row["launches"] = len(launch.launches)
        row["time_us"] = time_us(launch, cuda_graph=True)
        if len(launch.launches) == 2:
            row["input_us"] = time_us(Launcher((launch.launches[0],), ()), cuda_graph=True)
            row["conv_us"] = time_us(Launcher((launch.launches[1],), ()), cuda_graph=True)
        row["floor_us"] = floor_us(geom, image, outs)
        row["_outputs"] = have
    except Exception as e:  # one failing variant must not end the run
        row["error"] = f"{type(e).__name__}: {e}"[:400]
        traceback.print_exc()
    return row


def batch_rows(batch: int, quick: bool, stem: str = "resnet", inputs: str = "float32",
               outputs: tuple[str, ...] = ("u2",), full: bool = False,
               only: tuple[str, ...] = ()) -> list[dict]:
    case = make_case(batch, stem, inputs=inputs, outputs=outputs)
    image, weight, bias, specs, geom, kw = case
    ref = reference_outputs(image, weight, bias, specs, geom, kw) if batch <= 16 else None
    default_cfg = S.default_config(geom, SMS)
    default = run_variant(f"{default_cfg.kernel} default", default_cfg, case, None, ref)
    want = default.pop("_outputs", None)
    rows = [default]
    if S.ring_refusal(geom) is None:
        sweep = [v for v in RESNET_SWEEP if v[0] in QUICK] if quick else RESNET_SWEEP + (
            RING_EXTRA if full else [])
    else:
        sweep = SWEEP[:2] if quick else SWEEP
    if only:
        sweep = [v for v in RESNET_SWEEP + RING_EXTRA + SWEEP if v[0] in only]
    for name, make in sweep:
        try:
            cfg = make(geom)
        except Exception as e:
            rows.append({"benchmark": "stem_probe", "stem": stem, "batch": batch,
                         "input": inputs, "variant": name,
                         "error": f"{type(e).__name__}: {e}"[:400]})
            continue
        row = run_variant(name, cfg, case, want, ref)
        row.pop("_outputs", None)
        rows.append(row)
    try:
        base = cudnn_us(batch, geom)
    except Exception as e:
        base = None
        rows.append({"benchmark": "stem_probe", "stem": stem, "batch": batch,
                     "input": inputs, "variant": "cudnn fp16",
                     "error": f"{type(e).__name__}: {e}"[:400]})
    for r in rows:
        r["cudnn_fp16_us"] = base
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'stem':>7} {'batch':>5} {'input':>7} {'variant':26} {'stem us':>8} "
             f"{'conv us':>8} {'input':>6} {'floor':>6} {'x floor':>7} {'cudnn':>7} exact"]
    for r in rows:
        head = f"{r.get('stem', '-'):>7} {r['batch']:>5} {r.get('input', '-'):>7} " \
               f"{r['variant']:26}"
        if "error" in r:
            lines.append(f"{head} ERROR {r['error'][:90]}")
            continue
        exact = "/".join(str(r[k]) for k in ("exact_vs_default", "exact_vs_reference")
                         if k in r) or "-"
        cudnn = f"{r['cudnn_fp16_us']:7.1f}" if r.get("cudnn_fp16_us") else "      -"
        conv = f"{r['conv_us']:8.1f} {r['input_us']:6.1f}" if "conv_us" in r else \
            f"{'-':>8} {'-':>6}"
        lines.append(f"{head} {r['time_us']:8.1f} {conv} {r['floor_us']:6.1f} "
                     f"{r['time_us'] / r['floor_us']:7.2f} {cudnn} {exact}")
    return "\n".join(lines)


def winners(rows: list[dict]) -> list[str]:
    """Per (stem, input, batch): the fastest exact variant against the default (first row)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r.get("stem"), r.get("input"), r["batch"]), []).append(r)
    lines = []
    for (stem, inputs, batch), rs in groups.items():
        timed = [r for r in rs if "time_us" in r and r.get("exact_vs_default", True)
                 and r.get("exact_vs_reference", True)]
        if not timed:
            continue
        best, default = min(timed, key=lambda r: r["time_us"]), rs[0]
        base = f"{default['time_us']:.1f}" if "time_us" in default else "-"
        lines.append(f"{stem} {inputs} batch {batch}: fastest {best['variant']!r} "
                     f"{best['time_us']:.1f} us (default {default['variant']!r} {base} us; "
                     f"config {best['config']})")
    return lines


def ws_step_sass(u8_input: bool, arch: str = "sm_90a") -> dict:
    """Static SASS figures of the ws kernel's pooled-row step on ResNet's shape (outputs u8 and
    a derived u2 bit plane, no GPU): a consumer warp's step (the instructions from the wait
    before its first mma to the arrival after its last) and a producer warp's ring fill
    (from its wait for an empty slot to its arrival), their commonest opcodes, registers and
    spill; per_step = 8 consumer steps + 1 fill (one fill a step), the issue slots an SM
    spends per pooled row."""
    import collections

    from lowbit.kernels.cuda.nvrtc import compile_cubin, ptxas_report
    from lowbit.kernels.cuda.sass import kernel_instructions, opcodes
    from lowbit.kernels.cuda.stem_ws import (
        CONSUMER_WARPS,
        KIND_FORMULA,
        KIND_THRESHOLDS,
        WsOutput,
        WsShape,
        render,
    )

    shape = WsShape(C=3, PS=2, PP=1, NT_W=4, U8_INPUT=u8_input, HAS_STATUS=not u8_input,
                    QMIN=-128, QMAX=127, outputs=(WsOutput(KIND_FORMULA, 0, 8, 0, 255),
                                                  WsOutput(KIND_THRESHOLDS, 1, 2, 0, 3)))
    source = render(shape)
    ops = opcodes(kernel_instructions(compile_cubin(source, arch))["stem_ws"])
    first = ops.index(next(o for o in ops if o.startswith("IMMA")))
    last = len(ops) - 1 - ops[::-1].index(next(o for o in ops[::-1] if o.startswith("IMMA")))
    c0 = max(i for i in range(first) if ops[i].startswith("SYNCS.PHASECHK"))
    c1 = next(i for i in range(last, len(ops)) if ops[i].startswith("SYNCS.ARRIVE"))
    p0 = next(i for i in range(c1 + 1, len(ops)) if ops[i].startswith("SYNCS.PHASECHK"))
    p1 = next(i for i in range(p0, len(ops)) if ops[i].startswith("SYNCS.ARRIVE"))

    def top(part: list[str]) -> list[tuple[str, int]]:
        return collections.Counter(o.split(".")[0] for o in part).most_common(8)

    consumer, producer = ops[c0:c1 + 1], ops[p0:p1 + 1]
    return {"input": "uint8" if u8_input else "float32", "consumer_step": len(consumer),
            "producer_fill": len(producer),
            "per_step": CONSUMER_WARPS * len(consumer) + len(producer),
            "consumer_top": top(consumer), "producer_top": top(producer),
            **ptxas_report(source, arch, "stem_ws")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 256])
    ap.add_argument("--quick", action="store_true",
                    help="the default and three ring configs (ResNet), two gemm configs (else)")
    ap.add_argument("--full", action="store_true",
                    help="ResNet: the rest of the ring knobs too (float64 requantization, "
                    "maxnreg, 8 warps, ...; ~1 more minute)")
    ap.add_argument("--stems", nargs="+", default=["resnet"], choices=sorted(STEMS),
                    help="first-layer geometries (ResNet 7x7/2 + pool, AlexNet 11x11/4 + pool, "
                    "VGG 3x3/1)")
    ap.add_argument("--inputs", nargs="+", default=["float32", "uint8"],
                    choices=["float32", "uint8"], help="image dtypes (uint8: pixels + table)")
    ap.add_argument("--outputs", nargs="+", default=["u2"],
                    help="output precisions (u1/u2/s2/u4 in BITPLANE, others INT8); P@M: a "
                    "derived output, P read through a rising table from the value of the "
                    "earlier output M (ResNet-18's narrow stream: u8 u2@u8)")
    ap.add_argument("--variants", nargs="+", default=(),
                    help="only these variants beside the default (names as in the table)")
    ap.add_argument("--sass", action="store_true",
                    help="no GPU: the ws kernel's static SASS per pooled-row step "
                    "(`ws_step_sass`), float32 and uint8 images, then exit")
    args = ap.parse_args()
    if args.sass:
        for u8_input in (False, True):
            print(ws_step_sass(u8_input))
        return
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    out = args.out or ROOT / "benchmarks" / "results" / gpu_dirname() / "logs"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rows: list[dict] = []
    for stem in args.stems:
        for inputs in args.inputs:
            for batch in args.batches:
                rows += batch_rows(batch, args.quick, stem, inputs, tuple(args.outputs),
                                   args.full, tuple(args.variants))
                print(f"{stem} {inputs} batch {batch} done at {time.time() - t0:.0f} s",
                      flush=True)
    best = winners(rows)
    text = table(rows) + "\n\n" + "\n".join(best)
    print(text)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    doc = {"benchmark": "stem_probe", "gpu": gpu_name(), "date": dt.date.today().isoformat(),
           "versions": versions(), "rows": rows, "winners": best,
           "wall_s": time.time() - t0}
    (out / f"stem_probe-{stamp}.json").write_text(json.dumps(doc, indent=1))
    (out / f"stem_probe-{stamp}.txt").write_text(text + "\n")
    print("wrote", out / f"stem_probe-{stamp}.json", f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
