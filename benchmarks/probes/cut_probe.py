"""Where a bit-serial kernel's time goes (device call): the kernel timed whole and with parts cut
out through the templates' named cut points (`lowbit.kernels.cuda.bitserial_render.CUTS`: the
stages' MMAs, the epilogue, the stage loads after the first; a cut part's code stays behind a
branch the GPU never takes, so only its work goes; the cut variants compute garbage), and an
empty kernel of the same grid, block and shared memory (the launch floor).

A row: `workload:precision[:template]` with an optional --config (JSON, that template's knobs;
default: `default_bitserial`, or the template's default). --chained launches every variant
but the empty one with bind(chained=True): each replay then waits for the one before, as a
layer of a chain. Prints a table and writes $OUT/cut_probe.json.

Usage: python benchmarks/probes/cut_probe.py --rows apconv_b1_c1024:w1a2 \
           resnet50_s3_3x3_b256:w1a1:cuda.bitserial_tap_shift [--config '{...}'] \
           [--variants base mma epilogue mma+epilogue loads empty] [--chained]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common
from bitserial import bitserial_workload, gpu_inputs, workloads
from lowbit.core import Config
from lowbit.kernels.cuda import BY_NAME, BitserialKernel, default_bitserial
from lowbit.kernels.cuda.bitserial_render import CUTS
from lowbit.kernels.cuda.nvrtc import device_arch, load_kernel
from lowbit.kernels.timing import time_us

EMPTY = 'extern "C" __global__ void empty_kernel(int* p) { if (p == nullptr) p[0] = 0; }'
VARIANTS = ["base", *CUTS, "mma+epilogue", "empty"]


def empty_launcher(kernel: BitserialKernel, x):
    """An empty kernel with `kernel`'s one-tile grid, block and dynamic shared memory."""
    empty = load_kernel(EMPTY, "empty_kernel")
    grid = (*kernel._grid, 1)
    return lambda: empty.launch(grid, kernel._threads, [x], shared_mem=kernel._smem)


def probe(spec: str, config: dict | None, variants: list[str], chained: bool) -> dict:
    """One row's times by variant (us), or the error of a variant that failed."""
    name, prec, *template = spec.split(":")
    wl = bitserial_workload(dict(workloads(False))[name], prec)
    if template:
        family = BY_NAME[template[0]]
        cfg = Config(config) if config else family.default_config(wl)
    else:
        family, cfg = default_bitserial(wl)
    row = {"row": spec, "template": family.name, "config": dict(cfg), "chained": chained}
    x, w, params = gpu_inputs(wl, 1)
    cfg = family.checked_config(wl, cfg, family.space(wl))
    for variant in variants:
        cuts = () if variant in ("base", "empty") else tuple(variant.split("+"))
        try:
            kernel = BitserialKernel(family, wl, cfg, device_arch(), cuts=cuts)
            launch = (empty_launcher(kernel, x) if variant == "empty"
                      else kernel.bind(x, w, params, chained=chained))
            row[variant] = time_us(launch, cuda_graph=True)
        except Exception as e:  # a variant that fails is reported, not fatal
            row[variant] = f"{type(e).__name__}: {e}"[:200]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="+", default=["apconv_b1_c1024:w1a2", "apconv_b1_c1024:w1a1"])
    ap.add_argument("--config", type=json.loads, default=None,
                    help="a config of each row's named template (default: its default)")
    ap.add_argument("--variants", nargs="*", default=VARIANTS, choices=VARIANTS)
    ap.add_argument("--chained", action="store_true")
    args = ap.parse_args()
    rows = []
    for spec in args.rows:
        try:
            rows.append(probe(spec, args.config, args.variants, args.chained))
        except Exception as e:  # one row's failure is reported, not fatal
            rows.append({"row": spec, "error": f"{type(e).__name__}: {e}"[:300]})
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'row':40s} " + " ".join(f"{v:>12s}" for v in args.variants))
    for r in rows:
        cells = [f"{r[v]:12.2f}" if isinstance(r.get(v), float) else f"{'-':>12s}"
                 for v in args.variants]
        print(f"{r['row']:40s} " + " ".join(cells))
    print(f"wrote {common.write_probe('cut_probe', rows)}")


if __name__ == "__main__":
    main()
