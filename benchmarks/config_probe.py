"""Time bit-serial configs the space rules out by its register estimate (device call): each
listed config is checked bit for bit against lowbit.reference, then timed (CUDA-graph median)
in the same process as the configs it is compared with, with its ptxas registers and spill
bytes. A config that ptxas fits with a small spill is how the estimate (bitserial.OTHER_REGS)
gets revised: measure first.

Usage: python benchmarks/config_probe.py --rows FILE (a JSON list of {workload, precision,
config, note}: config a full config of the space's knobs). Prints and writes
$OUT/config_probe.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
from bitserial import bitserial_workload, gpu_inputs, workloads
from lowbit.core import Config
from lowbit.kernels.cuda import BITSERIAL, bitserial
from lowbit.kernels.cuda.nvrtc import ptxas_report
from lowbit.reference import run
from lowbit.tune.timing import time_us


def probe(wl, cfg: Config) -> dict:
    """{us, exact, registers, spill_bytes} of one config, or {error}."""
    saved = bitserial.REGISTER_FILE
    bitserial.REGISTER_FILE = 1 << 30  # the estimate only: ptxas decides below
    try:
        kernel = BITSERIAL.build(wl, cfg)
        regs = ptxas_report(kernel.source, kernel.arch, bitserial.kernel_name(cfg))
        if regs["registers"] * bitserial.threads(cfg) > saved:
            return {"error": f"ptxas: {regs} does not fit the register file", **regs}
        x, w, params = gpu_inputs(wl, 1)
        launch = kernel.bind(x, w, params)
        exact = bool(torch.equal(launch(), run(wl, x, w, params)))
        return {"us": time_us(launch, cuda_graph=True) if exact else None, "exact": exact,
                **regs}
    except Exception as e:  # reported, not fatal
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    finally:
        bitserial.REGISTER_FILE = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=Path, required=True)
    args = ap.parse_args()
    layers, results = dict(workloads(False)), []
    for item in json.loads(args.rows.read_text()):
        wl = bitserial_workload(layers[item["workload"]], item["precision"])
        row = {**item, **probe(wl, Config(item["config"]))}
        print(json.dumps(row), flush=True)
        results.append(row)
    common.write_probe("config_probe", results)


if __name__ == "__main__":
    main()
