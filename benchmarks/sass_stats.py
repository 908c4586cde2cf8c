"""Static SASS and ptxas figures of bit-serial kernels, without a GPU.

For each exact config of the given rows of a bitserial-*.json (or one --config of a family),
renders the kernel, compiles it with NVRTC for sm_90a (ptxas -v: registers, spill bytes) and
disassembles the cubin (`lowbit.kernels.cuda.sass`, nvdisasm): the main kernel's instruction
count and its commonest opcodes. The epilogue and the stage loop are straight-line code, so
static counts track the per-tile dynamic ones closely enough to compare versions of a kernel
(docs/history/bitserial.md: the epilogue's instruction counts, sessions S3-S7) before a
device run. Rows of before the families' split are read through `migrate_config`.

    python benchmarks/sass_stats.py --json results/.../bitserial-x.json --top 2
    python benchmarks/sass_stats.py --workload resnet50_s2_3x3_b256 --precision w1a1 \
        --template cuda.bitserial_tap_shift --config '{"BM": 128, "BN": 64, ...}'
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bitserial import bitserial_workload, exact_tries, tried_spec, workloads
from lowbit.core import Config
from lowbit.kernels.cuda import family_of, kernel_spec
from lowbit.kernels.cuda.nvrtc import compile_cubin, ptxas_report
from lowbit.kernels.cuda.sass import kernel_instructions, opcodes

ARCH = "sm_90a"


def stats(workload: str, precision: str, spec: Config) -> dict:
    """{sass, registers, spill_bytes, top, bra_div} of the kernel of these parameters."""
    wl = bitserial_workload(dict(workloads(False))[workload], precision)
    family = family_of(spec)
    cfg = family.config_of(spec)
    source = family.render(wl, cfg)
    kernel = family.kernel_name(cfg)
    ops = opcodes(kernel_instructions(compile_cubin(source, ARCH))[kernel])
    common = collections.Counter(o.split(".")[0] for o in ops).most_common(6)
    # BRA.DIV: shuffles under a divergent branch (docs/history/bitserial.md, session S8,
    # virtual-grid positions by carries)
    return {"sass": len(ops), **ptxas_report(source, ARCH, kernel), "top": common,
            "bra_div": ops.count("BRA.DIV")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="a bitserial-*.json: its rows' exact configs")
    ap.add_argument("--top", type=int, default=1, help="fastest configs per row (--json)")
    ap.add_argument("--workload")
    ap.add_argument("--precision")
    ap.add_argument("--template", default="cuda.bitserial_wgmma")
    ap.add_argument("--config", help="one config of --template as JSON (with --workload, "
                                     "--precision)")
    args = ap.parse_args()
    jobs: list[tuple[str, str, Config, float | None]] = []
    if args.json:
        for row in json.loads(args.json.read_text())["rows"]:
            jobs += [(row["workload"], row["precision"], tried_spec(row, t), t["us"])
                     for t in exact_tries(row)[: args.top]]
    elif args.config and args.workload and args.precision:
        jobs.append((args.workload, args.precision,
                     kernel_spec(args.template, json.loads(args.config)), None))
    else:
        ap.error("give --json, or --workload, --precision and --config")
    for wl, prec, spec, us in jobs:
        s = stats(wl, prec, spec)
        timed = f"{us:7.1f} us" if us is not None else "        -"
        print(f"{wl:24s} {prec} {timed}  sass {s['sass']:5d}  regs {s['registers']:3d}  "
              f"spill {s['spill_bytes']:3d} B  div {s['bra_div']}  "
              f"{family_of(spec).name} {spec['BM']}x{spec['BN']}  {s['top']}")


if __name__ == "__main__":
    main()
