"""The SASS of the bit-serial templates' default configs against a recorded baseline (no GPU).

`benchmarks/sass_baseline.json` holds, for the default config of every bit-serial kernel family
on the shared workloads (w1a1, w1a2, w2a2, with the benchmarks' epilogue; int32 and fp16
outputs on three layers; the benchmarks' GEMM 4096 and APNN-TC conv too) and for
`cuda.int8_wgmma`'s default on int8 layers, each kernel's instruction count and a digest of its
instructions (`lowbit.kernels.cuda.sass`: NVRTC cubin, nvdisasm, addresses dropped, branch
labels renumbered per kernel). It was recorded from the single `cuda.bitserial` template
(commit 1752cab) before its split into families, by benchmarks/sass_baseline_record.py (in git
history: commit 8b5a335); its configs are in that template's form, with the role they had
("default" / "default_sm80": `default_config(wl)`; "<family>@<arch>": the family's preferred
default), and a sample of the single template's spaces (tests/test_cuda_bitserial.py reads
both). Checked after the split: 798 of 798 entries, 2,616 kernels, the same instructions.

`python benchmarks/sass_check.py [--limit N] [--jobs J] [--sample K]` migrates each recorded
config (`lowbit.kernels.cuda.migrate_config`), checks that the family's `default_config` (or
`default_bitserial`, for the "default" roles) picks it, renders it with its family's template,
compiles it for the recorded arch and compares every kernel's instructions: same count and
digest, or a FAIL line. Exit status 1 on any difference. About 1 s of CPU per entry.
`--record` instead writes the current SASS into the entries that differ only in their SASS
(a deliberate kernel change), counted by output kind: the change's reach, to state in its
commit (e.g. the column-pair stores of 2026-11-27 reach int32 / fp16 / INT8 outputs only).
`--record-defaults` writes, into the entries whose default now picks another config (a
deliberate default change), that config (in the recorded form) and its SASS, and lists them.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

BASELINE = Path(__file__).resolve().parent / "sass_baseline.json"


def _resolved(entry: dict) -> tuple:
    """(workload, family name and config the entry records, in today's form, the family and
    config its role picks now: `default_bitserial` for "default" roles, else the recorded
    family's `default_config`)."""
    from lowbit.core import Config, workload_from_json
    from lowbit.kernels.cuda import BY_NAME, default_bitserial, migrate_config

    wl = workload_from_json(entry["workload_json"])
    name, cfg = migrate_config(entry["template"], Config(entry["config"]))
    if entry["role"].startswith("default"):
        family, picked = default_bitserial(wl, entry["arch"])
    else:
        family, picked = BY_NAME[name], BY_NAME[name].default_config(wl, entry["arch"])
    return wl, name, cfg, family, picked


def _sass(wl: object, name: str, cfg: object, arch: str) -> dict:
    """The SASS summary of family `name`'s kernels for (wl, cfg), compiled now for `arch`."""
    from lowbit.kernels.cuda import BY_NAME
    from lowbit.kernels.cuda.nvrtc import compile_cubin
    from lowbit.kernels.cuda.sass import sass_summary

    return sass_summary(compile_cubin(BY_NAME[name].render(wl, cfg), arch))


def compare_entry(entry: dict) -> tuple[list[str], dict]:
    """(differences of one baseline entry from what the current templates pick and compile,
    [] if none; the SASS summary compiled now)."""
    wl, name, cfg, family, picked = _resolved(entry)
    arch, role = entry["arch"], entry["role"]
    tag = f"{entry['workload']} {entry['precision']} {role} {arch} -> {name}"
    diffs = []
    if (family.name, picked) != (name, cfg):
        picker = ("default_bitserial picks " + family.name if role.startswith("default")
                  else "default_config picks")
        diffs.append(f"FAIL {tag}: {picker} {dict(picked)}")
    got = _sass(wl, name, cfg, arch)
    want = entry["sass"]
    for k in sorted(set(want) | set(got)):
        if want.get(k) != got.get(k):
            diffs.append(f"FAIL {tag}: {k} {want.get(k)} != {got.get(k)}")
    return diffs, got


def current_pick(entry: dict) -> tuple[str, dict] | None:
    """(family name, the recorded form of its config) that the entry's role picks now, None
    where it is the recorded config."""
    from lowbit.kernels.cuda import migrate_config

    _, name, cfg, family, picked = _resolved(entry)
    if (family.name, picked) == (name, cfg):
        return None
    spec = family.spec(picked)
    recorded = {k: spec[k] for k in entry["config"]}
    if migrate_config(entry["template"], recorded) != (family.name, picked):
        raise ValueError(f"{entry['workload']} {entry['role']}: {dict(picked)} has no "
                         f"recorded form")
    return family.name, recorded


def record_defaults(doc: dict, path: Path) -> None:
    """Write the configs the defaults pick now, and their SASS, into the entries they changed."""
    from lowbit.core import workload_from_json
    from lowbit.kernels.cuda import migrate_config

    changed = 0
    for entry in doc["entries"]:
        pick = current_pick(entry)
        if pick is None:
            continue
        entry["config"] = pick[1]
        name, cfg = migrate_config(entry["template"], pick[1])
        entry["sass"] = _sass(workload_from_json(entry["workload_json"]), name, cfg,
                              entry["arch"])
        changed += 1
        print(f"{entry['workload']} {entry['precision']} {entry['role']} {entry['arch']} -> "
              f"{pick[0]}", flush=True)
    path.write_text(json.dumps(doc, indent=1))
    print(f"recorded the new defaults of {changed} entries")


def output_kind(entry: dict) -> str:
    epi = json.loads(entry["workload_json"]).get("epilogue", {})
    return epi.get("out_layout", "int8") if epi.get("out", "int32") not in ("int32", "fp16") \
        else epi["out"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, default=BASELINE)
    ap.add_argument("--limit", type=int, default=0, help="check the first N entries only")
    ap.add_argument("--sample", type=int, default=0, help="check N random entries only")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--record", action="store_true",
                    help="write the current SASS of entries that differ only in SASS")
    ap.add_argument("--record-defaults", action="store_true",
                    help="write the configs the defaults pick now (and their SASS)")
    args = ap.parse_args()
    doc = json.loads(args.baseline.read_text())
    if args.record_defaults:
        record_defaults(doc, args.baseline)
        return
    entries = doc["entries"]
    if args.limit:
        entries = entries[: args.limit]
    if args.sample:
        entries = random.Random(0).sample(entries, min(args.sample, len(entries)))
    failed, kernels, recorded = 0, 0, Counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        for entry, (diffs, got) in zip(entries, pool.map(compare_entry, entries, chunksize=4),
                                       strict=True):
            kernels += len(entry["sass"])
            if args.record and diffs and not any("picks" in d for d in diffs):
                entry["sass"] = got
                recorded[output_kind(entry)] += 1
                continue
            failed += bool(diffs)
            for d in diffs:
                print(d, flush=True)
    print(f"{len(entries) - failed - sum(recorded.values())} of {len(entries)} entries "
          f"({kernels} kernels) pick and compile to the recorded SASS")
    if recorded:
        args.baseline.write_text(json.dumps(doc, indent=1))
        print("recorded the new SASS of", ", ".join(f"{n} {k}" for k, n in
                                                   sorted(recorded.items())), "entries")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
