"""Time bit-serial configs a family's space rules out by its register estimate (device call):
each listed config is checked against the family's space without its `registers` check
(`space(wl, relax=("registers",))`), against ptxas's register count and the register file,
bit for bit against lowbit.reference, then timed (CUDA-graph median) in the same process as
the configs it is compared with. A config that ptxas fits with a small spill is how the
estimate (bitserial_family.OTHER_REGS) gets revised: measure first.

Usage: python benchmarks/probes/config_probe.py --rows FILE (a JSON list of {workload,
precision, template, config, note}: config a full config of that template's knobs). Prints a
table and writes $OUT/config_probe.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import common
from bitserial import bitserial_workload, gpu_inputs, workloads
from lowbit.core import Config
from lowbit.core.hardware import TARGET
from lowbit.kernels.cuda import BY_NAME, BitserialKernel
from lowbit.kernels.cuda.bitserial_layout import threads
from lowbit.kernels.cuda.nvrtc import device_arch, ptxas_report
from lowbit.kernels.timing import time_us
from lowbit.reference import run


def probe(wl, family, cfg: Config) -> dict:
    """{us, exact, registers, spill_bytes} of one config, or {error}."""
    try:
        why = family.space(wl, relax=("registers",)).why_invalid(cfg)
        if why:
            return {"error": f"outside the space without its register check: {why}"}
        kernel = BitserialKernel(family, wl, cfg, device_arch())
        regs = ptxas_report(kernel.source, kernel.arch, family.kernel_name(cfg))
        if regs["registers"] * threads(kernel.spec) > TARGET.regs_per_sm:
            return {"error": f"ptxas: {regs} does not fit the register file", **regs}
        x, w, params = gpu_inputs(wl, 1)
        launch = kernel.bind(x, w, params)
        exact = bool(torch.equal(launch(), run(wl, x, w, params)))
        return {"us": time_us(launch, cuda_graph=True) if exact else None, "exact": exact,
                **regs}
    except Exception as e:  # reported, not fatal
        return {"error": f"{type(e).__name__}: {e}"[:300]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=Path, required=True)
    args = ap.parse_args()
    layers, results = dict(workloads(False)), []
    for item in json.loads(args.rows.read_text()):
        wl = bitserial_workload(layers[item["workload"]], item["precision"])
        row = {**item, **probe(wl, BY_NAME[item["template"]], Config(item["config"]))}
        print(json.dumps(row), flush=True)
        results.append(row)
    print(f"\n{'workload':24s} {'prec':5s} {'template':34s} {'us':>8s} {'regs':>5s} {'spill':>6s}")
    for r in results:
        us = f"{r['us']:8.2f}" if r.get("us") else f"{'-':>8s}"
        print(f"{r['workload']:24s} {r['precision']:5s} {r['template']:34s} {us} "
              f"{r.get('registers', '-'):>5} {r.get('spill_bytes', '-'):>6} {r.get('error', '')}")
    print(f"wrote {common.write_probe('config_probe', results)}")


if __name__ == "__main__":
    main()
