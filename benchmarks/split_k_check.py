"""Diagnose split-K configs of `cuda.bitserial` on a GPU: launch each config several times on
fresh poisoned outputs and report, per launch, how many outputs differ from the reference,
which rows / columns they sit in, and whether each wrong value is the reference minus (or plus)
one split's partial sum as stored in the workspace (a missing or doubled split).

    python benchmarks/split_k_check.py [--launches 10]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import common
from lowbit.core import Config
from lowbit.kernels.cuda import BITSERIAL, bitserial
from lowbit.reference import random_inputs, run
from test_cuda_bitserial import SPLIT_CASES


def check(wl, cfg: Config, launches: int) -> dict:
    x, w, params = random_inputs(wl, 4, device="cuda")
    want = run(wl, x.cpu(), w.cpu(), params.to("cpu"))
    out = torch.empty(want.shape, dtype=want.dtype, device="cuda")
    launch = BITSERIAL.build(wl, cfg).bind(x, w, params, out)
    ws = launch.split_workspace  # the partial sums the launches write (None without split-K)
    report = {"config": dict(cfg), "workload": wl.key, "launches": []}
    seen = None
    for _ in range(launches):
        out.view(torch.uint8).fill_(0xA5)
        got = launch().cpu()
        torch.cuda.synchronize()
        if got.dtype != torch.int32:
            got, ref = got.view(torch.uint8).flatten(), want.view(torch.uint8).flatten()
            bad = (got != ref).nonzero().flatten()
            report["launches"].append({"wrong": int(bad.numel())})
            continue
        bad = (got != want).nonzero()
        entry = {"wrong": int(bad.shape[0])}
        if bad.shape[0]:
            entry["rows"] = sorted({int(r) for r in bad[:, 0]})[:64]
            entry["cols"] = sorted({int(c) for c in bad[:, 1]})[:64]
            diff = (got - want)[bad[:, 0], bad[:, 1]]
            entry["diff_sample"] = [int(v) for v in diff[:8]]
            if ws is not None:
                cols, rows = bitserial.tile_grid(wl, cfg)
                part = ws.view(bitserial.split_k(cfg), rows * cfg["BM"], cols * cfg["BN"]).cpu()
                for z in range(part.shape[0]):
                    pz = part[z][bad[:, 0], bad[:, 1]]
                    entry[f"diff_eq_minus_split{z}"] = int((diff == -pz).sum())
                    entry[f"diff_eq_plus_split{z}"] = int((diff == pz).sum())
        key = (entry["wrong"], tuple(entry.get("diff_sample", [])))
        entry["same_as_previous"] = key == seen
        seen = key
        report["launches"].append(entry)
    return report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launches", type=int, default=10)
    args = ap.parse_args()
    arch = bitserial.device_arch()
    reports = []
    for wl, mma, changes in SPLIT_CASES:
        if mma == "wgmma" and arch != bitserial.WGMMA_ARCH:
            continue
        base = BITSERIAL.plain_config(wl, mma).replace(**changes)
        variants = [base, base.replace(SPLIT_K=1)]
        if mma == "wgmma":
            variants += [base.replace(STAGES=4), base.replace(STAGES=3)]
        for cfg in variants:
            if BITSERIAL.space(wl).is_valid(cfg):
                r = check(wl, cfg, args.launches)
                reports.append(r)
                print(json.dumps({k: v for k, v in r.items() if k != "workload"})[:900],
                      flush=True)
    path = common.write_results("split_k_check", reports)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
