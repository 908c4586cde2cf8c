"""Launch one bit-serial row's kernel a few times, for Nsight Compute to profile.

Takes a row of an earlier bitserial-*.json (workload, precision) and the config that ranked
`--rank` among its exact tries (0: the row's best; rows of before the families' split read
through `migrate_config`), with `--set` overrides of its kernel parameters, checks it bit for
bit, then launches it `--launches` times. Run it under ncu, e.g.

    ncu --clock-control none --kernel-name regex:bitserial_(persistent|wgmma|kernel) \
        --launch-skip 2 --launch-count 1 --set full -o prof \
        python3 benchmarks/profile_bitserial.py --json results/.../bitserial-x.json \
        --workload resnet50_s2_3x3_b256 --precision w1a1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bitserial import bitserial_workload, build, exact_tries, gpu_inputs, tried_spec, workloads
from lowbit.core import Config
from lowbit.reference import run


def ranked_config(path: Path, workload: str, precision: str, rank: int) -> Config:
    """The kernel parameters of the `rank`-th fastest exact config of the row (workload,
    precision) in `path`."""
    rows = json.loads(path.read_text())["rows"]
    for row in rows:
        if row["workload"] == workload and row["precision"] == precision:
            tried = exact_tries(row)
            if rank >= len(tried):
                raise ValueError(f"--rank {rank}: the row has {len(tried)} exact configs")
            return tried_spec(row, tried[rank])
    raise ValueError(f"no row ({workload}, {precision}) in {path}")


def knob_value(text: str):
    """A --set value: JSON where it parses (numbers, lists), else the string itself
    (REQUANT=threshold)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True, help="an earlier bitserial-*.json")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--precision", required=True, help="e.g. w1a1")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--launches", type=int, default=4)
    ap.add_argument("--set", action="append", default=[],
                    help="KNOB=VALUE overrides of the kernel parameters (values as JSON)")
    args = ap.parse_args()
    cfg = dict(ranked_config(args.json, args.workload, args.precision, args.rank))
    for kv in args.set:
        k, v = kv.split("=", 1)
        cfg[k] = knob_value(v)
    base = dict(workloads(False))[args.workload]
    wl = bitserial_workload(base, args.precision)
    x, w, params = gpu_inputs(wl, seed=1)
    launch = build(wl, Config(cfg)).bind(x, w, params)
    out = launch()
    if not torch.equal(out, run(wl, x, w, params)):
        raise SystemExit(f"{cfg} is not bit-exact")
    for _ in range(args.launches):
        launch()
    torch.cuda.synchronize()
    print(json.dumps({"workload": args.workload, "precision": args.precision, "config": cfg}))


if __name__ == "__main__":
    main()
