"""Depthwise and grouped convs on our kernels against cuDNN fp16 (GPU, same process).

Layers: MobileNet-V2's 17 depthwise 3x3s (10 distinct shapes, `triton.conv2d_depthwise`) and
ResNeXt-50 32x4d's 16 grouped 3x3s (7 distinct shapes, 32 groups of 4-32 channels,
`triton.conv2d_grouped_int8`), at batch 64 on 224 x 224 images (--batch to change it), each at
w8a8 (u8 activations, the ReLU6 / ReLU outputs, -> u8), w4a4 (packed u4 activations and s4
weights -> packed u4) and w2a2 (packed u2 / s2 -> packed u2), bias and ReLU fused.

Per layer and precision: the template's default config, bit-exact against `lowbit.reference.
run` (fresh random inputs, poisoned output), then its median time by CUDA events with L2
flushed (`kernels.timing.time_us`: `triton.testing.do_bench`, the tuner's timing); with
`--sweep N` also the N configs `tune.dispatch.candidate_configs` draws (default first), each
checked, and the fastest; cuDNN fp16 (channels_last, benchmark mode, `common.cudnn_fp16_conv_us`
with the layer's groups) timed the same way in the same process; with `--macs`, the default
config of each `triton.conv2d_depthwise` layer again at each multiply-accumulate form (MAC
int32: IMAD, fp32: FFMA, dp4a: 4 taps a dp4a, `depthwise_taps`), each checked, where the
layer's space takes it; the roofline byte floor
(each operand read once, the output written once, `perfmodel.roofline.workload_bytes`, at the
copy bandwidth measured in this run) for our storage and for fp16's; what zero-tuning dispatch
(`tune.dispatch.choose`) picks. A summary per network and precision adds the layers' times
weighted by how often each shape occurs.

    python benchmarks/probes/depthwise_probe.py [--batch 64] [--sweep 16] [--quick] [--macs]

Writes $OUT/depthwise_probe.json (`common.write_probe`) and prints a table; a failing case is
recorded with its error and the run goes on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from common import cudnn_fp16_conv_us, gpu_name, write_probe
from lowbit.core import ConvWorkload, Epilogue
from lowbit.core.validate import out_storage
from lowbit.kernels import get_template, load_backends
from lowbit.kernels.timing import time_us
from lowbit.perfmodel.roofline import measure_bandwidth, workload_bytes
from lowbit.reference import random_inputs, run

#: MobileNet-V2's depthwise 3x3s: (channels, input size at 224, stride, how many)
MOBILENET_V2 = [(32, 112, 1, 1), (96, 112, 2, 1), (144, 56, 1, 1), (144, 56, 2, 1),
                (192, 28, 1, 2), (192, 28, 2, 1), (384, 14, 1, 4), (576, 14, 1, 2),
                (576, 14, 2, 1), (960, 7, 1, 3)]
#: ResNeXt-50 32x4d's grouped 3x3s: (width, input size at 224, stride, how many), 32 groups
RESNEXT50 = [(128, 56, 1, 3), (256, 56, 2, 1), (256, 28, 1, 3), (512, 28, 2, 1),
             (512, 14, 1, 5), (1024, 14, 2, 1), (1024, 7, 1, 2)]
PRECISIONS = {
    "w8a8": dict(a="u8", w="s8", epilogue=Epilogue(bias=True, relu=True, out="u8")),
    "w4a4": dict(a="u4", w="s4", a_layout="packed", w_layout="packed",
                 epilogue=Epilogue(bias=True, relu=True, out="u4", out_layout="packed")),
    "w2a2": dict(a="u2", w="s2", a_layout="packed", w_layout="packed",
                 epilogue=Epilogue(bias=True, relu=True, out="u2", out_layout="packed")),
    # ResNeXt's w2a2 network form: u2 values a byte in, u2 bit planes out for the bit-serial
    # conv after, the bias at the output's shift
    "w2a2_net": dict(a="u2", w="s2", epilogue=Epilogue(shifted_bias=True, relu=True, out="u2",
                                                       out_layout="bitplane")),
}
NETWORKS = {"mobilenet_v2": ("triton.conv2d_depthwise", MOBILENET_V2, None),
            "resnext50_32x4d": ("triton.conv2d_grouped_int8", RESNEXT50, 32),
            # the same grouped layers on CUDA cores (up to 16 channels a group)
            "resnext50_32x4d_cuda": ("triton.conv2d_grouped_cuda", RESNEXT50[:5], 32)}


def layer_workload(shape: tuple, groups: int | None, batch: int, prec: str) -> ConvWorkload:
    c, h, stride, _ = shape
    return ConvWorkload(N=batch, H=h, W=h, C=c, K=c, R=3, S=3, stride=stride, pad=1,
                        groups=groups or c, **PRECISIONS[prec])


def poisoned_out(wl: ConvWorkload) -> torch.Tensor:
    shape, dtype = out_storage(wl)
    return torch.full(shape, 0x5A if dtype.itemsize == 1 else -12345, dtype=dtype,
                      device="cuda")


def timed(template, wl: ConvWorkload, cfg, x, w, params, ref) -> dict:
    """One config: exact against the reference, then the events median."""
    kernel = template.build(wl, cfg)
    out = poisoned_out(wl)
    launch = kernel.bind(x, w, params, out=out)
    launch()
    torch.cuda.synchronize()
    exact = bool(torch.equal(out, ref))
    return {"config": dict(cfg), "exact": exact, "time_us": time_us(launch) if exact else None}


def sweep(template, wl: ConvWorkload, n: int, x, w, params, ref) -> list[dict]:
    """The default config and n - 1 more of `candidate_configs` (each failing one recorded)."""
    from lowbit.tune.dispatch import candidate_configs

    out = []
    for cfg in candidate_configs(template, wl, n=n)[:n]:
        try:
            out.append(timed(template, wl, cfg, x, w, params, ref))
        except Exception as e:  # one config failing must not lose the others
            out.append({"config": dict(cfg), "error": f"{type(e).__name__}: {e}"[:300]})
    return out


#: the depthwise template's multiply-accumulate forms (`DEPTHWISE_KNOBS` MAC) --macs times
MACS = ("int32", "fp32", "dp4a")


def mac_rows(template, wl: ConvWorkload, x, w, params, ref) -> dict:
    """The default config at each MAC value of the layer's space (or why it is not there)."""
    out: dict = {}
    space = template.space(wl)
    for mac in MACS:
        cfg = template.default_config(wl).replace(MAC=mac)
        reason = space.why_invalid(cfg)
        try:
            out[mac] = {"refused": reason} if reason else timed(template, wl, cfg, x, w,
                                                                  params, ref)
        except Exception as e:  # one config failing must not lose the others
            out[mac] = {"config": dict(cfg), "error": f"{type(e).__name__}: {e}"[:300]}
    return out


def dispatch_pick(wl: ConvWorkload) -> dict | str:
    try:
        from lowbit.tune.dispatch import choose

        c = choose(wl)
        return {"template": c.template, "predicted_us": round(c.predicted_us, 2)}
    except Exception as e:  # recorded, the run goes on
        return f"{type(e).__name__}: {e}"[:200]


def measure(net: str, shape: tuple, prec: str, batch: int, bandwidth: float, n_sweep: int,
            fp16_us: dict, macs: bool = False) -> dict:
    name, _, groups = NETWORKS[net]
    c, h, stride, count = shape
    wl = layer_workload(shape, groups, batch, prec)
    fp16_bytes = 2 * (wl.N * wl.H * wl.W * wl.C + wl.K * wl.R * wl.S * (wl.C // wl.groups)
                      + wl.N * wl.P * wl.Q * wl.K)
    row: dict = {"model": net, "workload": f"{net}_c{c}_h{h}_s{stride}", "precision": prec,
                 "count": count, "shape": {f: getattr(wl, f) for f in (
                     "N", "H", "W", "C", "K", "R", "S", "stride", "pad", "groups")},
                 "key": wl.key, "impl": name, "bytes": workload_bytes(wl),
                 "floor_us": workload_bytes(wl) / bandwidth * 1e6,
                 "fp16_floor_us": fp16_bytes / bandwidth * 1e6,
                 "bandwidth_bytes_per_s": bandwidth}
    template = get_template(name)
    x, w, params = random_inputs(wl, seed=c + h + stride, device="cuda")
    ref = run(wl, x, w, params)
    cfg = template.default_config(wl)
    row["default"] = timed(template, wl, cfg, x, w, params, ref)
    row["config"], row["time_us"] = row["default"]["config"], row["default"]["time_us"]
    if macs and name == "triton.conv2d_depthwise":
        row["macs"] = mac_rows(template, wl, x, w, params, ref)
    if n_sweep > 1:
        tried = sweep(template, wl, n_sweep, x, w, params, ref)
        ok = [t for t in tried if t.get("time_us") is not None]
        row["sweep"] = tried
        if ok:
            best = min(ok, key=lambda t: t["time_us"])
            row["best_config"], row["best_us"] = best["config"], best["time_us"]
    key = (c, h, stride)
    if key not in fp16_us:
        try:
            fp16_us[key] = cudnn_fp16_conv_us(wl)
        except Exception as e:  # recorded, the run goes on
            fp16_us[key] = f"{type(e).__name__}: {e}"[:200]
    row["baselines_us"] = {"cudnn_fp16": fp16_us[key]}
    row["dispatch"] = dispatch_pick(wl)
    return row


def _fmt(v) -> str:
    return f"{v:9.1f}" if isinstance(v, float) else f"{'-':>9}"


def table(rows: list[dict]) -> None:
    print(f"\n{'layer':30s} {'prec':5s} {'n':>2} {'floor':>9} {'default':>9} {'best':>9} "
          f"{'cudnn16':>9} {'f16floor':>9}  x vs fp16  exact  dispatch")
    for r in rows:
        if "error" in r:
            print(f"{r['workload']:30s} {r['precision']:5s} ERROR {r['error']}")
            continue
        fp16 = r["baselines_us"]["cudnn_fp16"]
        ours = r.get("best_us") or r.get("time_us")
        ratio = f"{fp16 / ours:9.2f}" if isinstance(fp16, float) and ours else f"{'-':>9}"
        d = r.get("dispatch")
        print(f"{r['workload']:30s} {r['precision']:5s} {r['count']:2d} {_fmt(r['floor_us'])} "
              f"{_fmt(r.get('time_us'))} {_fmt(r.get('best_us'))} {_fmt(fp16)} "
              f"{_fmt(r['fp16_floor_us'])}  {ratio}  {r['default']['exact']!s:5s}  "
              f"{d['template'] if isinstance(d, dict) else d}")


def mac_table(rows: list[dict]) -> list[dict]:
    """--macs: each layer's default-config time per MAC value, and per network and precision
    their totals weighted by the layers' counts (layers where every value ran)."""
    print(f"\n{'layer':30s} {'prec':5s} {'n':>2} {'floor':>9} " + " ".join(
        f"{m:>9}" for m in MACS))
    totals: dict = {}
    for r in rows:
        if "macs" not in r:
            continue
        times = [r["macs"][m].get("time_us") for m in MACS]
        print(f"{r['workload']:30s} {r['precision']:5s} {r['count']:2d} {_fmt(r['floor_us'])} "
              + " ".join(_fmt(t) for t in times))
        t = totals.setdefault((r["model"], r["precision"]), {m: 0.0 for m in MACS})
        for m, v in zip(MACS, times, strict=True):
            t[m] = t[m] + r["count"] * v if t[m] is not None and v is not None else None
    out = []
    for (net, prec), t in totals.items():
        print(f"{net} {prec} MAC totals (us): " + ", ".join(
            f"{m} {v:.0f}" if v is not None else f"{m} -" for m, v in t.items()))
        out.append({"model": net, "precision": prec, "mac_total_us": t})
    return out


def summary(rows: list[dict]) -> list[dict]:
    """Per network and precision: the layers' times weighted by their counts (default config,
    best of the sweep, cuDNN fp16, byte floor), and the ratio fp16 / ours."""
    out = []
    for net in NETWORKS:
        for prec in PRECISIONS:
            rs = [r for r in rows if r.get("model") == net and r["precision"] == prec
                  and "error" not in r]
            if not rs or any(not isinstance(r["baselines_us"]["cudnn_fp16"], float)
                             or r.get("time_us") is None for r in rs):
                continue

            def total(get, rs=rs):
                return sum(r["count"] * get(r) for r in rs)

            s = {"model": net, "precision": prec, "layers": sum(r["count"] for r in rs),
                 "default_us": total(lambda r: r["time_us"]),
                 "best_us": total(lambda r: r.get("best_us") or r["time_us"]),
                 "cudnn_fp16_us": total(lambda r: r["baselines_us"]["cudnn_fp16"]),
                 "floor_us": total(lambda r: r["floor_us"])}
            s["fp16_over_default"] = s["cudnn_fp16_us"] / s["default_us"]
            s["fp16_over_best"] = s["cudnn_fp16_us"] / s["best_us"]
            out.append(s)
            print(f"{net:16s} {prec}: {s['layers']} layers, ours {s['default_us']:.0f} us "
                  f"(best {s['best_us']:.0f}), cuDNN fp16 {s['cudnn_fp16_us']:.0f} us, floor "
                  f"{s['floor_us']:.0f} us: {s['fp16_over_default']:.2f}x "
                  f"({s['fp16_over_best']:.2f}x tuned)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--sweep", type=int, default=0,
                    help="also time this many candidate configs per layer (default first)")
    ap.add_argument("--quick", action="store_true", help="w8a8 only")
    ap.add_argument("--net", choices=list(NETWORKS), nargs="+", help="these networks only")
    ap.add_argument("--precisions", choices=list(PRECISIONS), nargs="+", default=None)
    ap.add_argument("--macs", action="store_true",
                    help="also time each depthwise layer's default config at MAC " +
                         " / ".join(MACS))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("depthwise_probe needs a CUDA GPU")
    load_backends()
    bandwidth = measure_bandwidth()
    print(f"{gpu_name()}: copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    precs = args.precisions or (["w8a8"] if args.quick else list(PRECISIONS))
    rows: list[dict] = []
    for net in args.net or list(NETWORKS):
        fp16_us: dict = {}
        for shape in NETWORKS[net][1]:
            for prec in precs:
                try:
                    row = measure(net, shape, prec, args.batch, bandwidth, args.sweep, fp16_us,
                                  args.macs)
                except Exception as e:  # one layer failing must not lose the others
                    row = {"model": net, "workload": f"{net}_c{shape[0]}_h{shape[1]}_s"
                           f"{shape[2]}", "precision": prec,
                           "error": f"{type(e).__name__}: {e}"[:300]}
                rows.append(row)
                print(row["workload"], prec, row.get("time_us", row.get("error")), flush=True)
            torch.cuda.empty_cache()
    table(rows)
    rows += [{"summary": s} for s in summary(rows)]
    if args.macs:
        rows += [{"mac_summary": s} for s in mac_table(rows)]
    print("wrote", write_probe("depthwise_probe", rows))


if __name__ == "__main__":
    main()
