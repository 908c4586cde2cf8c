"""What bounds the few-channel pointwise convs (issue 34, item 4; GPU, same run).

MobileNet-V2's 1x1 expansion at 56x56, batch 8 (C = 24 -> K = 144: 25,088 rows, 0.6 MB in,
3.6 MB out, ~1.3 us of DRAM traffic) ran at 15.8-31.7 us on every int8 template (H100,
`perfmodel-20261128-042133.json`) against 10.9 us for cuDNN fp16. This probe times that layer
and variants that change one thing each -- the output (int32 / fp16 / s8 requantized), K
(128 / 144 / 160), C (24 / 32 / 64) -- on `triton.conv2d_int8` at a few tile shapes and on
`cuda.int8_wgmma`'s default, bit-exact against `lowbit.reference.run` first, with cuDNN fp16
beside each shape and the DRAM floor (bytes / copy bandwidth measured in this run).

    python3 benchmarks/probes/pointwise_probe.py     # rows to $OUT/pointwise_probe.json

--mobilenet: MobileNet-V2's expansion convs at batch 64 (112 x 112 16 -> 96, 56 x 56 24 ->
144, 28 x 28 32 -> 192, and 14 x 14 64 -> 384 in the float64 form only; 224-346 us in the
w8a8 network against a 30 us floor), first on the persistent `triton.conv2d_pointwise` (its
default and POINTWISE_VARIANTS), with the
epilogue the network plans (ReLU, u8 out, the bias folded into the float64 requantization:
"u8_f64"), the same in 32-bit arithmetic ("u8_r32": a 12-bit multiplier, what the plan picks
where the sum bound allows) and no epilogue ("int32"), each at the default and the tiles
below (8 warps added): how much of the time is the float64 epilogue, how much the tile.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from common import cudnn_fp16_conv_us, write_probe
from lowbit.core import Config, ConvWorkload, Epilogue
from lowbit.kernels import get_template, load_backends
from lowbit.kernels.timing import time_us
from lowbit.perfmodel.roofline import measure_bandwidth, workload_bytes
from lowbit.reference import random_inputs, run

EPILOGUES = {"s8": Epilogue(bias=True, relu=True, out="s8"), "int32": Epilogue(),
             "fp16": Epilogue(bias=True, out="fp16")}
#: (C, K, epilogue) at N = 8, 56 x 56, 1 x 1
SHAPES = [(24, 144, "s8"), (24, 144, "int32"), (24, 144, "fp16"), (24, 128, "s8"),
          (24, 160, "s8"), (32, 144, "s8"), (64, 144, "s8"), (32, 128, "s8")]
IGEMM_CONFIGS = [dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=32, GROUP_M=1, LOOP_ORDER="rsc",
                      SPLIT_K=1, num_stages=2, num_warps=w)
                 for m, n, w in ((128, 64, 4), (256, 64, 8), (128, 128, 4), (64, 64, 4),
                                 (64, 128, 4))]


def timed(template: str, wl: ConvWorkload, cfg, x, w, params, ref) -> dict:
    t = get_template(template)
    reason = t.unsupported_reason(wl)
    if reason:
        return {"template": template, "skipped": reason[:160]}
    cfg = t.default_config(wl) if cfg is None else Config(cfg)
    if not t.space(wl).is_valid(cfg):
        return {"template": template, "config": dict(cfg), "skipped": "not in the space"}
    out = torch.full(ref.shape, 0x5A if ref.dtype.itemsize == 1 else -7, dtype=ref.dtype,
                     device="cuda")
    launch = t.build(wl, cfg).bind(x, w, params, out=out)
    launch()
    torch.cuda.synchronize()
    return {"template": template, "config": dict(cfg), "exact": bool(torch.equal(out, ref)),
            "time_us": time_us(launch)}


#: the network's epilogue forms of --mobilenet
NETWORK_EPILOGUES = {
    "u8_f64": Epilogue(relu=True, out="u8", shifted_bias=True),
    "u8_r32": Epilogue(relu=True, out="u8", shifted_bias=True, requant32=True),
    "int32": Epilogue()}
#: (H = W, C, K, epilogue) at N = 64: MobileNet-V2's three widest expansion convs
MOBILENET_SHAPES = [(hw, c, k, out) for hw, c, k in ((112, 16, 96), (56, 24, 144), (28, 32, 192))
                    for out in NETWORK_EPILOGUES] + [(14, 64, 384, "u8_f64")]
MOBILENET_CONFIGS = [*IGEMM_CONFIGS, *(dict(c, num_warps=8) for c in IGEMM_CONFIGS
                                       if c["num_warps"] == 4 and c["BLOCK_M"] >= 128)]
#: the persistent 1x1 kernel (`triton.conv2d_pointwise`): its default, then variants of the
#: programs a SM and the tile (each shape's default BLOCK_N where None)
POINTWISE = "triton.conv2d_pointwise"
POINTWISE_VARIANTS = [dict(PROGRAMS_PER_SM=2), dict(BLOCK_M=64, PROGRAMS_PER_SM=4),
                      dict(num_stages=4)]


def pointwise_configs(wl: ConvWorkload) -> list:
    """None (the default), then the default changed by each of POINTWISE_VARIANTS."""
    t = get_template(POINTWISE)
    if t.unsupported_reason(wl):
        return [None]
    d = t.default_config(wl)
    return [None, *(dict(d, **v) for v in POINTWISE_VARIANTS)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mobilenet", action="store_true",
                    help="MobileNet-V2's expansion convs at batch 64 (module docstring)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("pointwise_probe needs a CUDA GPU")
    load_backends()
    bandwidth = measure_bandwidth()
    rows = []
    shapes = MOBILENET_SHAPES if args.mobilenet else [(56, c, k, out) for c, k, out in SHAPES]
    configs = MOBILENET_CONFIGS if args.mobilenet else IGEMM_CONFIGS
    batch = 64 if args.mobilenet else 8
    epilogues = NETWORK_EPILOGUES if args.mobilenet else EPILOGUES
    for hw, c, k, out in shapes:
        wl = ConvWorkload(N=batch, H=hw, W=hw, C=c, K=k, R=1, S=1, w="s8", a="s8",
                          epilogue=epilogues[out])
        name = f"pw_{hw}_{c}to{k}_b{batch}_{out}"
        x, w, params = random_inputs(wl, seed=c * 1000 + k, device="cuda")
        ref = run(wl, x, w, params)
        impls = []
        for cfg in pointwise_configs(wl) if args.mobilenet else []:
            try:
                impls.append(timed(POINTWISE, wl, cfg, x, w, params, ref))
            except Exception as e:  # one config failing must not lose the others
                impls.append({"template": POINTWISE, "config": cfg,
                              "error": f"{type(e).__name__}: {e}"[:200]})
        for cfg in [None, *configs]:
            try:
                impls.append(timed("triton.conv2d_int8", wl, cfg, x, w, params, ref))
            except Exception as e:  # one config failing must not lose the others
                impls.append({"template": "triton.conv2d_int8", "config": cfg,
                              "error": f"{type(e).__name__}: {e}"[:200]})
        try:
            impls.append(timed("cuda.int8_wgmma", wl, None, x, w, params, ref))
        except Exception as e:
            impls.append({"template": "cuda.int8_wgmma", "error": f"{type(e).__name__}: {e}"[:200]})
        try:
            fp16 = cudnn_fp16_conv_us(wl)
        except Exception as e:
            fp16 = None
            print(f"{name}: cuDNN fp16 failed: {e}")
        floor = workload_bytes(wl) / bandwidth * 1e6
        rows.append({"workload": name, "C": c, "K": k, "out": out, "floor_us": floor,
                     "cudnn_fp16_us": fp16, "impls": impls})
        times = [i.get("time_us") for i in impls if i.get("exact")]
        print(f"{name:24s} floor {floor:5.2f} fp16 {fp16 or float('nan'):6.1f} | " + " ".join(
            f"{i['time_us']:6.1f}" if i.get("exact") else ("  skip" if "skipped" in i else
                                                          "  FAIL") for i in impls)
              + f" | best {min(times) if times else float('nan'):.1f}", flush=True)
    print("wrote", write_probe("pointwise_probe_mobilenet" if args.mobilenet
                               else "pointwise_probe", rows))


if __name__ == "__main__":
    main()
