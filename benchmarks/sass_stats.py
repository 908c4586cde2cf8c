"""Static SASS and ptxas figures of bit-serial kernels, without a GPU.

For each exact config of the given rows of a bitserial-*.json (or one --config), renders the
kernel, compiles it with NVRTC for sm_90a (ptxas -v: registers, spill bytes) and disassembles
the cubin with nvdisasm (on PATH, or from the `nvidia-cuda-nvdisasm` wheel): the main kernel's
instruction count and its commonest opcodes. The epilogue and the stage loop are straight-line
code, so static counts track the per-tile dynamic ones closely enough to compare versions of a
kernel (NOTES.md, "Bit-serial epilogue") before a device run.

    python benchmarks/sass_stats.py --json results/.../bitserial-x.json --top 2
    python benchmarks/sass_stats.py --workload resnet50_s2_3x3_b256 --precision w1a1 \
        --config '{"BM": 128, "BN": 64, ...}'
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bitserial import bitserial_workload, exact_tries, workloads
from lowbit.core import Config
from lowbit.kernels.cuda import bitserial
from lowbit.kernels.cuda.nvrtc import compile_cubin, ptxas_report

ARCH = "sm_90a"


def nvdisasm_path() -> str:
    """nvdisasm on PATH or inside the nvidia-cuda-nvdisasm wheel; ValueError when neither."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        nvidia = None
    for root in getattr(nvidia, "__path__", []):
        for cand in Path(root).glob("*/bin/nvdisasm"):
            return str(cand)
    raise ValueError("nvdisasm not found: put it on PATH or pip install nvidia-cuda-nvdisasm")


def sass_opcodes(cubin: bytes, kernel: str) -> list[str]:
    """Opcodes of `kernel`'s SASS, in order (predicates dropped)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([nvdisasm_path(), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    body = text.split(f".text.{kernel}:")[1].split(".section")[0]
    return [m[1] for m in re.findall(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", body)]


def stats(workload: str, precision: str, config: dict) -> dict:
    wl = bitserial_workload(dict(workloads(False))[workload], precision)
    source = bitserial.render(wl, Config(config))
    kernel = bitserial.kernel_name(config)
    ops = sass_opcodes(compile_cubin(source, ARCH), kernel)
    common = collections.Counter(o.split(".")[0] for o in ops).most_common(6)
    # BRA.DIV: shuffles under a divergent branch (NOTES.md, "Virtual-grid positions")
    return {"sass": len(ops), **ptxas_report(source, ARCH, kernel), "top": common,
            "bra_div": ops.count("BRA.DIV")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="a bitserial-*.json: its rows' exact configs")
    ap.add_argument("--top", type=int, default=1, help="fastest configs per row (--json)")
    ap.add_argument("--workload")
    ap.add_argument("--precision")
    ap.add_argument("--config", help="one config as JSON (with --workload, --precision)")
    args = ap.parse_args()
    jobs: list[tuple[str, str, dict, float | None]] = []
    if args.json:
        for row in json.loads(args.json.read_text())["rows"]:
            jobs += [(row["workload"], row["precision"], t["config"], t["us"])
                     for t in exact_tries(row)[: args.top]]
    elif args.config and args.workload and args.precision:
        jobs.append((args.workload, args.precision, json.loads(args.config), None))
    else:
        ap.error("give --json, or --workload, --precision and --config")
    for wl, prec, cfg, us in jobs:
        s = stats(wl, prec, cfg)
        timed = f"{us:7.1f} us" if us is not None else "        -"
        print(f"{wl:24s} {prec} {timed}  sass {s['sass']:5d}  regs {s['registers']:3d}  "
              f"spill {s['spill_bytes']:3d} B  div {s['bra_div']}  "
              f"{cfg['MMA']} {cfg['BM']}x{cfg['BN']}  {s['top']}")


if __name__ == "__main__":
    main()
