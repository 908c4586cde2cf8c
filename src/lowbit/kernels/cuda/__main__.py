"""`python -m lowbit.kernels.cuda --list [--workload NAME] [--precision w1a2] [--arch sm_90a]`:
each bit-serial family (and cuda.int8_wgmma), its knobs with their docs and requirements, its
checks, and with a workload the size of its space there, the time that took, and its default
config; then `default_bitserial`'s pick. NAME is a layer of the shipped suites
(`lowbit.core.workloads.SUITES`); the precision sets weights (b1 for 1 bit, else signed) and
activations (b1 for 1 bit, else unsigned), the output the next layer's bit planes."""

from __future__ import annotations

import argparse
import time

from ...core import Epilogue, Layout, Precision, Workload, parse_wa
from ...core.workloads import SUITES, load_workloads
from .bitserial_families import FAMILIES, default_bitserial
from .int8_wgmma import INT8_WGMMA


def shared_workload(name: str, precision: str) -> Workload:
    """Layer `name` of the shipped suites at `precision` (wXaY) in bit planes, its epilogue
    bias + ReLU + requantized bit planes of the activations' width."""
    layers = dict(nw for suite in SUITES for nw in load_workloads(suite))
    if name not in layers:
        raise ValueError(f"no layer {name!r}; layers: {', '.join(sorted(layers))}")
    wb, ab = parse_wa(precision)
    w = Precision(1, "binary") if wb == 1 else Precision(wb, "signed")
    a = Precision(1, "binary") if ab == 1 else Precision(ab)
    bp = Layout.BITPLANE
    epi = Epilogue(bias=True, relu=True, out=Precision(ab), out_layout=bp)
    return layers[name].replace(w=w, a=a, w_layout=bp, a_layout=bp, epilogue=epi)


def listing(wl: Workload | None, arch: str) -> list[str]:
    lines = []
    for family in (*FAMILIES, INT8_WGMMA):
        lines += family.describe(wl)
        if wl is None:
            lines.append("")
            continue
        reason = family.workload_reason(wl) or family.arch_reason(arch)
        if reason:
            lines += [f"  on {wl.key} ({arch}): not supported: {reason}", ""]
            continue
        start, cpu = time.perf_counter(), time.process_time()
        size = len(family.space(wl, arch))
        took, cpu = time.perf_counter() - start, time.process_time() - cpu
        lines.append(f"  on {wl.key} ({arch}): {size} configs (listed in {took:.2f} s, "
                     f"{cpu:.2f} s of CPU); default {dict(family.default_config(wl, arch))}")
        lines.append("")
    if wl is not None:
        family, config = default_bitserial(wl, arch)
        lines.append(f"default_bitserial: {family.name} {dict(config)}")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m lowbit.kernels.cuda",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="list the families and their knobs")
    ap.add_argument("--workload", help="a layer of the shipped suites, e.g. resnet50_s3_3x3")
    ap.add_argument("--precision", default="w1a2")
    ap.add_argument("--arch", default="sm_90a")
    args = ap.parse_args(argv)
    if not args.list:
        ap.error("nothing to do: pass --list")
    wl = shared_workload(args.workload, args.precision) if args.workload else None
    print("\n".join(listing(wl, args.arch)))


if __name__ == "__main__":
    main()
