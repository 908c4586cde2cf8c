"""One-off: record benchmarks/sass_baseline.json from the single `cuda.bitserial` template
(commit 1752cab), before it was split into kernel families. Run with that tree on the path:

    PYTHONPATH=<old tree>/src python benchmarks/sass_baseline_record.py --jobs 2

Entries (role: which default): for every shared workload (and the benchmarks' GEMM 4096 and
APNN-TC conv) at w1a1, w1a2, w2a2 with the benchmarks' epilogue (bias, ReLU, requantized bit
planes), and at w1a2 with int32 and fp16 outputs on a few layers:
- "default" / "default_sm80": `BITSERIAL.default_config(wl)` on sm_90a / sm_80 (the untuned
  kernel the network engine runs);
- per family, its default by the rule the family templates keep: the first of the old preferred
  configs (with REQUANT="threshold" where the output allows) that is of that family, valid, within
  the accumulator limit and its regime's conditions (`_first_default`), the one-tile wgmma's
  followed by `small_grid_default`; the persistent families' lists are the one-tile lists with
  PERSIST=1 (the old template had no persistent defaults except the tap-shift teams);
- `cuda.int8_wgmma`'s default on int8 layers.
Also a sample of valid configs of the old spaces (with their grid, threads, shared memory and
accumulator registers) for the migration tests.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sass_check import BASELINE, sass_summary

from lowbit.core import Config, Epilogue, Layout, Precision, workload_from_json
from lowbit.core.workloads import SUITES, load_workloads
from lowbit.kernels.base import NUM_SMS
from lowbit.kernels.cuda import BITSERIAL, INT8_WGMMA, bitserial
from lowbit.kernels.cuda.bitserial import (
    DEFAULTS,
    TAP_SHIFT_DEFAULT_MAX_K,
    TEAMS_DEFAULT_MAX_K,
    acc_regs,
    conv_shape,
    planes,
    small_grid_default,
    threshold_epilogue,
    tile_grid,
)
from lowbit.kernels.cuda.nvrtc import compile_cubin

BP = Layout.BITPLANE
PRECISIONS = ("w1a1", "w1a2", "w2a2")


def family(c) -> str:
    if c["TAP_SHIFT"]:
        return "tap_shift"
    if c["MMA"] == "wgmma":
        return "wgmma_persistent" if c["PERSIST"] else "wgmma"
    return "mma_sync_persistent" if c["PERSIST"] else "mma_sync"


def precisions(name: str) -> tuple[Precision, Precision]:
    wb, ab = int(name[1]), int(name[3])
    w = Precision(1, "binary") if wb == 1 else Precision(wb, "signed")
    a = Precision(1, "binary") if ab == 1 else Precision(ab)
    return w, a


def layers() -> list[tuple[str, object]]:
    from lowbit.core import ConvWorkload, GemmWorkload

    out = [(n, wl) for s in SUITES for n, wl in load_workloads(s)]
    out += [("gemm_4096", GemmWorkload(M=4096, N=4096, K=4096)),
            ("apconv_b1_c1024", ConvWorkload(N=1, H=16, W=16, C=1024, K=1024, R=3, S=3, pad=1))]
    return out


def family_default(wl, fam: str, arch: str):
    """The rule of the module docstring (None where no preferred config of the family fits)."""
    mma = "mma_sync" if fam.startswith("mma_sync") else "wgmma"
    if mma == "wgmma" and arch != "sm_90a":
        return None
    space = BITSERIAL.space(wl, arch)
    requant = "threshold" if threshold_epilogue(wl) else "multiply"
    limit = 128 if mma == "mma_sync" else 136
    for d in DEFAULTS[mma]:
        if fam.endswith("persistent") and fam != "tap_shift" and not d["TAP_SHIFT"]:
            d = {**d, "PERSIST": 1}
        if family(d) != fam:
            continue
        cfg = Config(d).replace(REQUANT=requant)
        if not space.is_valid(cfg) or acc_regs(wl, d) > limit:
            continue
        teams = d.get("TEAMS", 1) > 1
        if d["TAP_SHIFT"] and conv_shape(wl).kout > (
                TEAMS_DEFAULT_MAX_K if teams else TAP_SHIFT_DEFAULT_MAX_K):
            continue
        if teams and planes(wl)[0] < 2:
            continue
        if (d["BM"] == 192 or d["TAP_SHIFT"]) and math.prod(tile_grid(wl, d)) < NUM_SMS:
            continue
        return small_grid_default(wl, cfg, space) if fam == "wgmma" else cfg
    return None


def jobs() -> list[dict]:
    out = []
    for name, base in layers():
        variants = [(p, Epilogue(bias=True, relu=True, out=Precision(int(p[3])), out_layout=BP))
                    for p in PRECISIONS]
        if name in ("resnet50_s3_3x3", "fc_b128_4096to4096", "resnet18_stem_7x7"):
            variants += [("w1a2", Epilogue(bias=True)), ("w1a2", Epilogue(out="fp16"))]
        for prec, epi in variants:
            w, a = precisions(prec)
            wl = base.replace(w=w, a=a, w_layout=BP, a_layout=BP, epilogue=epi)
            if not BITSERIAL.supports(wl):
                continue
            roles = {"default": (BITSERIAL.default_config(wl, arch="sm_90a"), "sm_90a"),
                     "default_sm80": (BITSERIAL.default_config(wl, arch="sm_80"), "sm_80")}
            for fam in ("mma_sync", "mma_sync_persistent", "wgmma", "wgmma_persistent",
                        "tap_shift"):
                for arch in ("sm_90a", "sm_80"):
                    cfg = family_default(wl, fam, arch)
                    if cfg is not None:
                        roles[f"{fam}@{arch}"] = (cfg, arch)
            seen = set()
            for role, (cfg, arch) in roles.items():
                key = (cfg, arch)
                out.append({"workload": name, "precision": prec, "workload_json": wl.to_json(),
                            "role": role, "arch": arch, "template": BITSERIAL.name,
                            "config": dict(cfg), "kernel": bitserial.kernel_name(cfg),
                            "duplicate": key in seen})
                seen.add(key)
    s8 = Precision(8, "signed")
    for name, base in layers()[:12]:
        epi = Epilogue(bias=True, relu=True, out=s8, out_layout=Layout.INT8)
        wl = base.replace(w=s8, a=s8, w_layout=Layout.INT8, a_layout=Layout.INT8, epilogue=epi)
        if not INT8_WGMMA.supports(wl):
            continue
        cfg = INT8_WGMMA.default_config(wl)
        out.append({"workload": name, "precision": "w8a8", "workload_json": wl.to_json(),
                    "role": "int8_default", "arch": "sm_90a", "template": INT8_WGMMA.name,
                    "config": dict(cfg), "kernel": bitserial.kernel_name(cfg),
                    "duplicate": False})
    return out


def compile_entry(entry: dict) -> dict:
    if entry["duplicate"]:
        return entry
    wl = workload_from_json(entry["workload_json"])
    source = bitserial.render(wl, Config(entry["config"]))
    return {**entry, "sass": sass_summary(compile_cubin(source, entry["arch"]))}


def space_sample(n: int = 40) -> list[dict]:
    """Valid configs of the old spaces (a few workloads, both archs) with derived figures."""
    rng = random.Random(1)
    picks = ["resnet50_s3_3x3", "resnet50_s5_3x3_b256", "fc_b128_4096to4096",
             "apconv_sweep_c1024", "resnet18_56x56_64to128_s2", "resnet18_stem_7x7"]
    out = []
    for name, base in layers():
        if name not in picks:
            continue
        for prec in ("w1a2", "w2a2", "w1a1"):
            w, a = precisions(prec)
            epi = Epilogue(bias=True, relu=True, out=Precision(int(prec[3])), out_layout=BP)
            wl = base.replace(w=w, a=a, w_layout=BP, a_layout=BP, epilogue=epi)
            for arch in ("sm_90a", "sm_80"):
                configs = BITSERIAL.space(wl, arch).all_configs()
                for c in rng.sample(configs, min(n, len(configs))):
                    out.append({"workload_json": wl.to_json(), "arch": arch, "config": dict(c),
                                "kernel": bitserial.kernel_name(c),
                                "grid": list(tile_grid(wl, c)),
                                "threads": bitserial.threads(c),
                                "smem": bitserial.smem_bytes(wl, c),
                                "acc_regs": acc_regs(wl, c), "space_size": len(configs)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=BASELINE)
    args = ap.parse_args()
    todo = jobs()
    print(f"{len(todo)} entries, {sum(not e['duplicate'] for e in todo)} to compile", flush=True)
    with ProcessPoolExecutor(args.jobs) as pool:
        done = list(pool.map(compile_entry, todo, chunksize=4))
    by_key = {(e["workload_json"], json.dumps(e["config"], sort_keys=True), e["arch"]): e["sass"]
              for e in done if "sass" in e}
    for e in done:
        e["sass"] = by_key[(e["workload_json"], json.dumps(e["config"], sort_keys=True),
                            e["arch"])]
        del e["duplicate"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    args.out.write_text(json.dumps({"recorded_from": f"cuda.bitserial at {commit}",
                                    "entries": done, "space_sample": space_sample()},
                                   indent=1) + "\n")
    print(f"wrote {args.out}: {len(done)} entries")


if __name__ == "__main__":
    main()
