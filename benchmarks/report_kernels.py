"""Renderers of the kernel suites (int8 conv / GEMM, bit-serial, layer chains, ablations,
MMA peaks) and of the tuner; registered with `report_core.suite` on import."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from report_core import (
    Result,
    by_gpu,
    drop_same,
    gpu_heading,
    latest,
    latest_rows,
    plural,
    provenance,
    ratio,
    run_of,
    span,
    suite,
    table,
    us,
)

# --- kernel suites --------------------------------------------------------------------------

IMPL = {"triton.conv2d_int8": "igemm", "triton.conv2d_int8_tma": "tma",
        "cuda.int8_wgmma": "int8_wgmma", "triton.conv2d_fp16": "fp16",
        "triton.gemm_int8": "triton"}


def int8_template(impl: str, cfg: dict) -> str:
    text = IMPL.get(impl, impl)
    if cfg.get("LOOP_ORDER", "rsc") != "rsc":
        text += " " + cfg["LOOP_ORDER"]
    if cfg.get("SPLIT_K", 1) > 1:
        text += f" split {cfg['SPLIT_K']}"
    return text


@suite("conv", "Int8 convolution against cuDNN fp16 and im2col + `_int_mm`",
       "benchmarks/conv.py", benchmarks=("tma_conv",))
def render_conv(files: list[Result]) -> list[str]:
    out = ["Each layer's latest run: the fastest bit-exact config of the int8 templates' slices "
           "(plus tuned configs), w8a8, bias + ReLU -> s8 NHWC; each template's best time is in "
           "the file. Ratios > 1: ours faster.", ""]
    for gpu, group in by_gpu(files):
        picked = latest_rows(group, lambda r: (r.get("workload"), r.get("precision")))
        rows = []
        for f, r in picked:
            b, cg, t = r.get("baselines_us") or {}, r.get("cuda_graph_us") or {}, r["time_us"]
            ours_g = cg.get(r.get("impl")) or cg.get("ours") or cg.get("triton")
            graph = (f"{ratio(cg.get('cudnn_fp16'), ours_g)} ({us(ours_g)})" if ours_g else "-")
            rows.append([r["workload"], r.get("precision", "-"), f.link(us(t)),
                         int8_template(r.get("impl", ""), r.get("config") or {}),
                         us(r.get("floor_us")), ratio(t, r.get("floor_us")),
                         ratio(b.get("cudnn_fp16"), t), ratio(b.get("int_mm_im2col"), t),
                         ratio(b.get("default_config"), t), graph, run_of(f)])
        out += gpu_heading(gpu, by_gpu(files))
        out += table(*drop_same(["layer", "prec", "ours us", "template", "floor us", "ours / floor",
                      "cuDNN fp16 / ours", "im2col + `_int_mm` / ours", "default / ours",
                      "graph: cuDNN / ours (ours us)", "run"],
                     rows, "run"))
        out += ["", provenance(f for f, _ in picked), ""]
        out += _int8_target_block(picked)
    return out


def _int8_target_block(picked: list[tuple[Result, dict]]) -> list[str]:
    lines = target_lines(INT8_TARGETS, picked)
    return ["Targets (issue 3), on the rows above:", "", *lines, ""] if lines else []


def summarize_gemm(files: list[Result]) -> str:
    """Per shape of the latest runs: ours, `_int_mm` / ours and ours / floor."""
    picked = latest_rows(files, lambda r: (r.get("workload"), r.get("precision")))
    parts = [f"{r['workload']} {f.link(us(r['time_us']))} us, `_int_mm` / ours "
             f"{ratio((r.get('baselines_us') or {}).get('int_mm'), r['time_us'])}, "
             f"{ratio(r['time_us'], r.get('floor_us'))}x floor" for f, r in picked]
    return ("The Triton template's whole space per shape (int32 out, like `_int_mm`): "
            + "; ".join(parts) + ". Bound: the FC shapes stream their weights at about half "
            "the copy bandwidth; GEMM 8192^3 sits at 1.09x its floor.")


@suite("gemm", "Int8 GEMM against `torch._int_mm`", "benchmarks/gemm.py",
       concluded=summarize_gemm)
def render_gemm(files: list[Result]) -> list[str]:
    out = ["Each shape's latest run: the Triton template's whole space (int32 out, like "
           "`torch._int_mm`), `cuda.int8_wgmma` beside it.", ""]
    for gpu, group in by_gpu(files):
        picked = latest_rows(group, lambda r: (r.get("workload"), r.get("precision")))
        rows = []
        for f, r in picked:
            b, cg, t, cfg = (r.get("baselines_us") or {}, r.get("cuda_graph_us") or {},
                             r["time_us"], r.get("config") or {})
            tile = "x".join(str(cfg.get(k, "?")) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
            if cfg.get("SPLIT_K", 1) > 1:
                tile += f", split {cfg['SPLIT_K']} ({cfg.get('SPLIT_SUM', 'second_kernel')})"
            ours_g = cg.get("ours") or cg.get("triton")
            graph = (f"{ratio(cg.get('int_mm'), ours_g)} ({us(cg.get('int_mm'))} / "
                     f"{us(ours_g)})" if ours_g and cg.get("int_mm") else "-")
            rows.append([r["workload"], f.link(us(t)), tile, us(r.get("floor_us")),
                         ratio(t, r.get("floor_us")), ratio(b.get("int_mm"), t), graph,
                         ratio(b.get("fp16_matmul"), t), ratio(b.get("default_config"), t),
                         us(b.get("cuda.int8_wgmma")), run_of(f)])
        out += gpu_heading(gpu, by_gpu(files))
        out += table(*drop_same(["GEMM", "ours us", "config", "floor us", "ours / floor",
                      "`_int_mm` / ours", "graph: `_int_mm` / ours (us)", "fp16 matmul / ours",
                      "default / ours", "cuda.int8_wgmma us", "run"], rows, "run"))
        out += ["", provenance(f for f, _ in picked), ""]
        out += _int8_target_block(picked)
    return out


@suite("gemv", "Skinny int8 GEMMs (M <= 64): the split-K weight-streaming GEMV",
       "benchmarks/probes/gemv_probe.py")
def render_gemv(files: list[Result]) -> list[str]:
    out = ["Each shape's latest run: `triton.gemv_int8`'s default, the int8 templates' "
           "defaults and cuBLAS fp16 (CUDA events, L2 flushed), then CUDA-graph replays; "
           "every output bit-exact. Floor: the weights read once at the copy bandwidth.", ""]
    for gpu, group in by_gpu(files):
        picked = latest_rows(group, lambda r: r.get("workload"))
        convs = [(f, r) for f, r in picked if r.get("op") == "conv2d"]
        picked = [(f, r) for f, r in picked if r.get("op") != "conv2d"]
        if not picked and not convs:
            continue
        rows = []
        for f, r in picked:
            impls, b = r.get("impls") or {}, r.get("baselines_us") or {}
            gemv, fp16 = impls.get("triton.gemv_int8") or {}, r.get("fp16_matmul") or {}
            t = gemv.get("time_us")
            rows.append([r["workload"], f.link(us(t)), us(r.get("floor_us")),
                         us(b.get("cuda.int8_wgmma_default")),
                         us(b.get("triton.gemm_int8_default")), us(fp16.get("time_us")),
                         ratio(fp16.get("time_us"), t),
                         ratio(fp16.get("graph_us"), gemv.get("graph_us")),
                         str(r.get("engine_default", "-"))])
        out += gpu_heading(gpu, by_gpu(files))
        if rows:
            out += [*table(["GEMM (M x N x K)", "gemv us", "floor us", "int8_wgmma us",
                            "gemm_int8 us", "fp16 us", "fp16 / gemv", "graph: fp16 / gemv",
                            "engine default"], rows), ""]
        if convs:
            out += [*_gemv_conv_table(convs), ""]
        out += [provenance(f for f, _ in picked + convs), ""]
    return out


def _gemv_conv_table(picked: list) -> list[str]:
    """The conv rows of the gemv suite (`gemv_probe.py --conv`): the GEMV's gather against
    the conv templates' defaults and cuDNN fp16."""
    rows = []
    for f, r in picked:
        impls, b = r.get("impls") or {}, r.get("baselines_us") or {}
        gemv, fp16 = impls.get("triton.gemv_int8") or {}, r.get("fp16_conv") or {}
        t = gemv.get("time_us")
        rows.append([r["workload"], "x".join(str(v) for v in r.get("gemm_shape") or []),
                     f.link(us(t)), us(r.get("floor_us")),
                     *(us(b.get(f"{name}_default")) for name in
                       ("triton.conv2d_int8", "triton.conv2d_int8_tma", "cuda.int8_wgmma")),
                     us(fp16.get("time_us")), ratio(fp16.get("time_us"), t),
                     ratio(fp16.get("graph_us"), gemv.get("graph_us")),
                     str(r.get("engine_default", "-"))])
    return ["Convs of at most 64 output pixels (`--conv`), the GEMV gathering its rows "
            "against the conv templates' defaults and cuDNN fp16:", "",
            *table(["conv", "M x N x K", "gemv us", "floor us", "conv2d_int8 us",
                    "conv2d_int8_tma us", "int8_wgmma us", "cuDNN fp16 us", "fp16 / gemv",
                    "graph: fp16 / gemv", "engine default"], rows)]


def family(cfg: dict) -> str:
    """The bit-serial kernel family a config runs (docs/design.md, "Bit-serial families")."""
    persistent = cfg.get("PERSIST", 0)
    if cfg.get("TAP_SHIFT"):
        return "tap-shift" + (" persistent" if persistent else "")
    if cfg.get("MMA", "mma_sync") == "wgmma":
        if cfg.get("A_IN_HALO"):
            return "wgmma in-place"
        return "wgmma persistent" if persistent else "wgmma one-tile"
    return "mma.sync persistent" if persistent else "mma.sync one-tile"


def kernel_tile(cfg: dict) -> str:
    """The config's family and block tile (the results file has its other knobs)."""
    return f"{family(cfg)} {cfg.get('BM', '?')}x{cfg.get('BN', '?')}"


@dataclass(frozen=True)
class Target:
    """A goal on the rows of a table: value(row) >= goal (or <= goal with `at_most`)."""

    name: str
    goal: float
    keep: Callable[[dict], bool]
    value: Callable[[dict], float | None]
    at_most: bool = False


def _b256(r: dict) -> bool:
    return r["workload"].startswith("resnet50_") and r["workload"].endswith("_b256")


def _vs(key: str) -> Callable[[dict], float | None]:
    """Baseline `key` (or APNN-TC's published time) over the row's time."""
    def value(r: dict) -> float | None:
        base = (r.get("apnn_tc_published_us") if key == "apnn_tc"
                else (r.get("baselines_us") or {}).get(key))
        return base / r["time_us"] if base and r.get("time_us") else None
    return value


def _over_floor(r: dict) -> float | None:
    return r["time_us"] / r["floor_us"] if r.get("floor_us") else None


def _prec(p: str, keep: Callable[[dict], bool]) -> Callable[[dict], bool]:
    return lambda r: r["precision"] == p and keep(r)


# bit-serial targets by the name the results files give them (their "targets" field)
BITSERIAL_TARGETS = {
    "w1a1_vs_int8_conv_b256": (_prec("w1a1", _b256), _vs("int8_best")),
    "w1a2_vs_int8_conv_b256": (_prec("w1a2", _b256), _vs("int8_best")),
    "w1a2_vs_cudnn_fp16_b256": (_prec("w1a2", _b256), _vs("cudnn_fp16")),
    "w1a2_gemm_vs_int_mm": (_prec("w1a2", lambda r: r["workload"].startswith("fc_")),
                            _vs("int_mm")),
    "apnn_tc_speedup": (lambda r: bool(r.get("apnn_tc_published_us")), _vs("apnn_tc")),
}
# int8 targets of issue 3 (the conv / GEMM files do not carry them)
_INT8 = lambda r: r.get("precision") == "w8a8"  # noqa: E731
INT8_TARGETS = (
    Target("b256 conv vs cuDNN fp16", 1.8, lambda r: _INT8(r) and _b256(r), _vs("cudnn_fp16")),
    Target("b256 conv ours / floor", 1.3, lambda r: _INT8(r) and _b256(r), _over_floor, True),
    Target("ResNet-50 b16 conv vs cuDNN fp16", 3.0,
           lambda r: _INT8(r) and re.fullmatch(r"resnet50_s\d_3x3", r["workload"]) is not None,
           _vs("cudnn_fp16")),
    Target("every conv vs im2col + `_int_mm`", 1.5, _INT8, _vs("int_mm_im2col")),
    Target("GEMM 8192^3 vs `_int_mm`", 1.2, lambda r: r["workload"] == "fc_b8192_8192to8192",
           _vs("int_mm")),
    Target("FC vs `_int_mm`", 1.0, lambda r: r["workload"].startswith("fc_")
           and r["workload"] != "fc_b8192_8192to8192", _vs("int_mm")),
)


def target_lines(targets: Iterable[Target], picked: list[tuple[Result, dict]]) -> list[str]:
    """One line per target: on how many of the rows it applies to it is met, and the value of
    each row that misses it where some meet it (all values are in the table)."""
    out = []
    for t in targets:
        found = [(r["workload"], r["precision"], v) for _, r in picked
                 if t.keep(r) and (v := t.value(r)) is not None]
        if not found:
            continue
        missed = [(w, p, v) for w, p, v in found if not ((v <= t.goal) if t.at_most
                                                           else (v >= t.goal))]
        detail = ", ".join(f"{w} {p} {v:.2f}" for w, p, v in missed)
        out.append(f"- {t.name} {'<=' if t.at_most else '>='} {t.goal}: met on "
                   f"{len(found) - len(missed)} of {len(found)}"
                   + (f" (missed: {detail})" if 0 < len(missed) < len(found) else ""))
    return out


def file_targets(targets: dict) -> list[Target]:
    return [Target(f"`{name}`", goal, *BITSERIAL_TARGETS[name])
            for name, goal in sorted(targets.items()) if name in BITSERIAL_TARGETS]


def _fp16(baselines: dict) -> float | None:
    """cuDNN fp16 for convolutions, the fp16 matmul for GEMMs."""
    return baselines.get("cudnn_fp16") or baselines.get("fp16_matmul")


def _mma_sync_only(picked: list[tuple[Result, dict]]) -> list[str]:
    """Precisions whose every row runs an mma.sync kernel (none of the later families), when
    other precisions do not: the rows the compact table shows."""
    fams: dict[str, set[str]] = {}
    for _, r in picked:
        fams.setdefault(r["precision"], set()).add(family(r.get("config") or {}).split()[0])
    only = sorted(p for p, f in fams.items() if f == {"mma.sync"})
    return only if len(only) < len(fams) else []


def _legacy_line(picked: list[tuple[Result, dict]], precisions: list[str]) -> list[str]:
    """Per precision that `_mma_sync_only` picks, the range of its speedups over fp16 across
    the workloads, and the files of its rows."""
    if not precisions:
        return []
    rows = [(f, r) for f, r in picked if r["precision"] in precisions]
    gains: dict[str, list[float]] = {}
    for _, r in rows:
        if (fp16 := _fp16(r.get("baselines_us") or {})) and r.get("time_us"):
            gains.setdefault(r["precision"], []).append(fp16 / r["time_us"])
    used = sorted({f for f, _ in rows}, key=lambda f: f.order)
    dates = ", ".join(dict.fromkeys(f.date for f in used))
    return ["", f"Precisions that only the mma.sync kernels serve (runs {dates}), x fp16 over "
            f"{len({r['workload'] for _, r in rows})} workloads: " + ", ".join(
                f"{p} {min(g):.2f}-{max(g):.2f}x" for p, g in sorted(gains.items()))
            + "; per workload in " + ", ".join(f.link(f.name) for f in used) + "."]


@suite("bitserial", "Bit-serial convolution and GEMM on b1 AND tensor cores",
       "benchmarks/bitserial.py")
def render_bitserial(files: list[Result]) -> list[str]:
    out = ["Per layer and precision the fastest bit-exact row over all committed runs (an old "
           "row keeps its run's date), with that run's baselines (`int8_best`: our tuned int8 "
           "templates; fp16: cuDNN, or the fp16 matmul for GEMMs; `_int_mm`: after im2col for "
           "convs; APNN-TC: its published time). Epilogue: bias + ReLU -> requantized bit "
           "planes.", ""]
    groups = by_gpu(files)
    for gpu, group in groups:
        best: dict[tuple, tuple[Result, int, dict]] = {}
        for f in group:
            for i, r in enumerate(f.rows):
                if r.get("time_us") is None or r.get("verified") is False:
                    continue
                k = (r["workload"], r["precision"])
                if k not in best or r["time_us"] < best[k][2]["time_us"]:
                    best[k] = (f, i, r)
        first = {}
        for f in group:
            for r in f.rows:
                first.setdefault(r["workload"], len(first))
        picked = [(f, r) for f, _, r in sorted(best.values(), key=lambda t: (
            first[t[2]["workload"]], t[2]["precision"]))]
        legacy = _mma_sync_only(picked)
        rows = []
        for f, r in picked:
            if r["precision"] in legacy:
                continue
            t, b = r["time_us"], r.get("baselines_us") or {}
            dflt = r.get("default_config_us") or b.get("default_config")
            rows.append([r["workload"], r["precision"], f.link(us(t)), us(r.get("floor_us")),
                         ratio(t, r.get("floor_us")), us(dflt), ratio(b.get("int8_best"), t),
                         ratio(_fp16(b), t), ratio(b.get("int_mm_im2col") or b.get("int_mm"), t),
                         ratio(r.get("apnn_tc_published_us"), t),
                         kernel_tile(r.get("config") or {}), run_of(f)])
        out += gpu_heading(gpu, groups)
        out += table(*drop_same(["workload", "prec", "us", "floor us", "us / floor",
                                 "default us", "x int8_best", "x fp16", "x `_int_mm`",
                                 "x APNN-TC", "kernel (knobs in the file)", "run"], rows,
                                "run"))
        out += _legacy_line(picked, legacy)
        out += ["", provenance(f for f, _ in picked), ""]
        targets = latest(group).doc.get("targets") or {}
        lines = target_lines(file_targets(targets), picked)
        unknown = sorted(set(targets) - set(BITSERIAL_TARGETS))
        if lines or unknown:
            out += ["Targets (issue 6; from the results file), on the rows above:", ""]
            out += lines + [f"- `{n}` >= {targets[n]}: not evaluated by report.py"
                            for n in unknown] + [""]
    return out


def summarize_layer_chain(files: list[Result]) -> str:
    """Per layer and precision: the plain pair's time per layer against the chained one's,
    and the empty kernel's."""
    f = latest(files)
    parts = [f"{r['workload']} {r['precision']} {us(r['pair_us'])} -> {us(r['chained_us'])}"
             f" (auto {us(r.get('chained_auto_us'))})" for r in f.rows]
    empty = [(r.get("empty") or {}) for r in f.rows]
    return ("Each layer reads the previous one's bit-plane output (C = K, stride 1); us per "
            "layer of x -> y -> x plain -> chained by `bind(chained=True)` at the best config "
            "and trigger (auto: the trigger `chain_trigger` picks): " + "; ".join(parts)
            + ". A kernel that only triggers and waits: "
            + f"{span([e.get('pair_us') for e in empty], us)} -> "
            + f"{span([e.get('chained_us') for e in empty], us)} us.")


@suite("layer_chain", "Bit-serial layers chained by programmatic dependent launch",
       "benchmarks/layer_chain.py", concluded=summarize_layer_chain)
def render_layer_chain(files: list[Result]) -> list[str]:
    out = ["Each layer reads the previous one's bit-plane output (C = K, stride 1). isolated: "
           "one launcher replayed; pair: x -> y -> x plain, per layer; chained: the pair with "
           "`bind(chained=True)` at the best config and trigger; auto: the trigger "
           "`chain_trigger` picks; empty: a kernel of the default's launch that only triggers "
           "and waits. Latest run.", ""]
    groups = by_gpu(files)
    for gpu, group in groups:
        f = latest(group)
        rows = []
        for r in f.rows:
            best = min(r["configs"], key=lambda c: c["chained_us"])
            trig = ("start" if best["chained_us"] == best.get("chained_start_us")
                    else "after_mma")
            empty, b = r.get("empty") or {}, r.get("baselines_us") or {}
            rows.append([r["workload"], r["precision"], f.link(us(r["isolated_us"])),
                         us(r["pair_us"]),
                         f"{us(r['chained_us'])} ({trig}, {best['config'].get('BN')} wide)",
                         us(r.get("chained_auto_us")),
                         f"{us(empty.get('pair_us'))} / {us(empty.get('chained_us'))}",
                         us(r.get("floor_us")), ratio(b.get("cudnn_fp16_pair"), r["chained_us"]),
                         ratio(r.get("apnn_tc_published_us"), r["chained_us"])])
        out += gpu_heading(gpu, groups)
        out += table(["layer", "prec", "isolated us", "pair us", "chained us (trigger)",
                      "auto us", "empty pair / chained us", "floor us",
                      "cuDNN fp16 pair / chained", "APNN-TC / chained"], rows)
        out += ["", provenance([f]), ""]
    return out


MMA_STEPS = ("default", "tuned_tiles", "register_packing", "duplicate_aware_load")


def _mma_steps(f: Result) -> dict[str, dict[str, dict]]:
    """Per workload, the ablation's rows by step ("s4": the m16n8k64 template's default)."""
    cells: dict[str, dict[str, dict]] = {}
    for r in f.rows:
        step = "s4" if r["impl"].endswith("s4") else r["step"]
        cells.setdefault(r["workload"], {})[step] = r
    return cells


def _step_text(s: dict) -> str:
    return f"{us(s['time_us'])} ({ratio(s['time_us'], s['floor_us'])}x)"


def summarize_mma_ablation(files: list[Result]) -> str:
    """Per layer the default, the fastest step and cuDNN fp16; s4 against s8's default."""
    cells = _mma_steps(latest(files))
    parts, s4 = [], []
    for wl, steps in cells.items():
        best = min((k for k in MMA_STEPS if k in steps), key=lambda k: steps[k]["time_us"])
        fp16 = (next(iter(steps.values())).get("baselines_us") or {}).get("cudnn_fp16")
        parts.append(f"{wl} {_step_text(steps['default'])} -> {best} "
                     f"{_step_text(steps[best])}, cuDNN fp16 {us(fp16)}")
        if "s4" in steps:
            s4.append(steps["s4"]["time_us"] / steps["default"]["time_us"])
    return ("`cuda.mma_conv_s8` (w8a8 -> u4 packed), us (x floor) of the default and of its "
            "fastest ablation step: " + "; ".join(parts) + "."
            + (" The s4 (m16n8k64, INT4 emulated on Hopper) default: "
               f"{span(s4, '{:.1f}'.format)}x the s8 default's time." if s4 else ""))


@suite("mma_ablation", "Tiled mma.sync conv template: ablation", "benchmarks/mma_ablation.py",
       concluded=summarize_mma_ablation)
def render_mma_ablation(files: list[Result]) -> list[str]:
    out = ["`cuda.mma_conv_s8` (ResNet-50 3x3, batch 256, w8a8 -> u4 packed), each step added to "
           "the previous: us (x floor); `s4`: the m16n8k64 template's default (INT4 is emulated "
           "on Hopper). Latest run.", ""]
    groups = by_gpu(files)
    for gpu, group in groups:
        f = latest(group)
        rows = []
        for wl, steps in _mma_steps(f).items():
            first = next(iter(steps.values()))
            row = [wl] + [_step_text(s) if (s := steps.get(k)) else "-" for k in MMA_STEPS]
            row += [us(steps["s4"]["time_us"]) if "s4" in steps else "-",
                    us((first.get("baselines_us") or {}).get("cudnn_fp16"))]
            rows.append(row)
        out += gpu_heading(gpu, groups)
        out += [f"File: {f.link(f.name)}.", ""]
        out += table(["layer", *MMA_STEPS, "s4 default", "cuDNN fp16 us"], rows)
        out += ["", provenance([f]), ""]
    return out


APCONV_MECHANISMS = (("empty", "empty kernel"), ("cp_async", "16-byte cp.async"),
                     ("bulk", "bulk copies"), ("tma", "tensor copies, 16-byte boxes"),
                     ("tma_px", "tensor copies, 128-byte boxes"),
                     ("tma_mc", "128-byte boxes, weights multicast (clusters of 4)"))
APCONV_PROBE = ("Copy-only kernels of the APNN-TC conv's grid (b1, 16 x 16, C = K = 1,024; the "
                "probe's script is in git history, before ce0749b): each block lands its window "
                "and weights, then stops; medians of interleaved rounds, us")


def summarize_apconv_floor(files: list[Result]) -> str:
    """Per precision the fastest copy mechanism, the empty kernel and the whole kernel."""
    parts = []
    for r in latest(files).rows:
        med = r["median_us"]
        copies = {(label, bn): med[f"{key}_bn{bn}"] for key, label in APCONV_MECHANISMS[1:]
                  for bn in (32, 64) if med.get(f"{key}_bn{bn}") is not None}
        (label, bn), t = min(copies.items(), key=lambda kv: kv[1])
        empty = min(v for k, v in med.items() if k.startswith("empty_"))
        parts.append(f"{r['precision']}: {label} (BN {bn}) {us(t)}, an empty kernel "
                     f"{us(empty)}, the committed kernel {us(med.get('real_default'))}")
    return f"{APCONV_PROBE}. Fastest delivery: " + "; ".join(parts) + "."


@suite("apconv_floor", "Operand-delivery floor of the APNN-TC conv", "",
       concluded=summarize_apconv_floor)
def render_apconv_floor(files: list[Result]) -> list[str]:
    out = [f"{APCONV_PROBE}, with the committed default kernel beside them.", ""]
    groups = by_gpu(files)
    for gpu, group in groups:
        f = latest(group)
        cols = [(r["precision"], bn) for r in f.rows for bn in (32, 64)]
        med = {r["precision"]: r["median_us"] for r in f.rows}
        rows = [[label] + [us(med[p].get(f"{key}_bn{bn}")) for p, bn in cols]
                for key, label in APCONV_MECHANISMS]
        rows.append(["committed default kernel (whole)"]
                    + [us(med[p].get("real_default")) if bn == 32 else "-" for p, bn in cols])
        out += gpu_heading(gpu, groups)
        out += [f"File: {f.link(f.name)}.", ""]
        out += table(["mechanism"] + [f"{p} BN {bn}" for p, bn in cols], rows)
        out += ["", provenance([f]), ""]
    return out


@suite("b1_mma_peak", "Tensor-core rates with no loads", "benchmarks/b1_mma_peak.py")
def render_b1_mma_peak(files: list[Result]) -> list[str]:
    out = ["b1 AND rates of the MMA instructions alone (T bit-ops/s), best and range over the "
           "block shapes and operand sources timed. Latest run.", ""]
    groups = by_gpu(files)
    for gpu, group in groups:
        f = latest(group)
        rates: dict[str, list[float]] = {}
        for r in f.rows:
            kind = re.sub(r" (ss|rs) swz\d+$", "", r["kind"])
            rates.setdefault(kind, []).append(r["tops"])
        rows = [[k, f.link(f"{max(v):,.0f}"), f"{min(v):,.0f} - {max(v):,.0f}", len(v)]
                for k, v in rates.items()]
        out += [f"**{gpu}**", "", *table(["instruction", "best", "range", "shapes"], rows)]
        out += ["", provenance([f]), ""]
    return out


# --- tuning and accuracy --------------------------------------------------------------------

STRATEGIES = ("random", "sa", "diversity", "tpe")


def _tuning_kinds(files: list[Result]) -> dict[str, list[Result]]:
    return {k: [f for f in files if f.benchmark == k] for k in
            ("tuning", "tuning_timed", "tuning_multigpu")}


def _multigpu_line(f: Result) -> str:
    runs = "; ".join(f"{r['gpus']} GPU(s): {r['wall_s']} s, best {us(r['best_us'])} us"
                     for r in f.doc.get("runs", []))
    return (f"Distributed ({f.link(f.name)}, {f.gpu}, {f.date}): {f.doc.get('trials')} "
            f"trials of {f.doc.get('workload')}: {runs}.")


def summarize_tuning(files: list[Result]) -> str:
    """The strategies' median trials to 0.95x over the replayed layers, the timed tunes'
    speedups over the default and wall times, and the distributed run."""
    kinds, parts = _tuning_kinds(files), []
    if kinds["tuning"]:
        f = latest(kinds["tuning"])
        trials = {s: [r["trials_to_095"][s] for r in f.rows if s in r.get("trials_to_095", {})]
                  for s in STRATEGIES}
        parts.append(f"Replays of {plural(len(f.rows), 'exhaustively measured space')}, "
                     f"{f.doc.get('seeds', '?')} seeds: trials to 0.95x the exhaustive best, "
                     "median over the layers: " + ", ".join(
                         f"{s} {statistics.median(v):g}" for s, v in trials.items() if v)
                     + "; quality@500 " + span([r.get("quality_at_500") for r in f.rows])
                     + ".")
    if kinds["tuning_timed"]:
        picked = [r for _, r in latest_rows(kinds["tuning_timed"], lambda r: r.get("workload"))]
        gain = [(r.get("default_us") or (r.get("defaults_us") or {}).get(r.get("best_template"))
                 ) / r["best_us"] for r in picked]
        wall = [r["wall_s"] for r in picked if r.get("wall_s")]
        parts.append(f"Timed tunes (`lowbit.tune.tune`) of {plural(len(picked), 'layer')}: "
                     f"default / best {span(gain, '{:.2f}'.format)}x"
                     + (f", {span(wall)} s each" if wall else "")
                     + f", {sum(r.get('failures') or 0 for r in picked)} failures.")
    if kinds["tuning_multigpu"]:
        parts.append(_multigpu_line(latest(kinds["tuning_multigpu"])))
    return " ".join(parts)


@suite("tuning", "Tuning quality", "benchmarks/tuning.py",
       benchmarks=("tuning_timed", "tuning_tables", "tuning_multigpu"),
       concluded=summarize_tuning)
def render_tuning(files: list[Result]) -> list[str]:
    out: list[str] = []
    used: list[Result] = []
    kinds = _tuning_kinds(files)
    by_name = {f.name: f for f in files}

    def named(name: str) -> str:  # a file the tuning run names: linked where it is in the tree
        return by_name[name].link(name) if name in by_name else name

    for f in [latest(kinds["tuning"])] if kinds["tuning"] else []:
        inputs = [by_name[n] for n in (*f.doc.get("tables", []), f.doc.get("timed"))
                  if n in by_name]
        timed = {r["workload"]: (t, r) for t in inputs if t.benchmark == "tuning_timed"
                 for r in t.rows}
        out += [f"Replays of the exhaustively measured spaces (every config built, verified and "
                f"timed: {', '.join(named(n) for n in f.doc.get('tables', []))}) with each "
                f"strategy, {f.doc.get('seeds', '?')} seeds; trials to reach 0.95x the "
                "exhaustive best, median [min-max]; the timed tune as a user runs it "
                f"({named(f.doc.get('timed', '-'))}). File: {f.link(f.name)}.", ""]
        rows = []
        for r in f.rows:
            seeds = r.get("trials_to_095_by_seed") or {}
            t, tr = timed.get(r["workload"], (None, {}))
            tuned = ratio(tr.get("default_us"), tr.get("best_us"))
            rows.append([r["workload"], r.get("space_size", "-"),
                         us(r.get("exhaustive_best_us")),
                         t.link(tuned) if t and tuned != "-" else tuned,
                         " / ".join(f"{r['trials_to_095'][s]} [{min(seeds[s])}-{max(seeds[s])}]"
                                    if s in seeds else str(r["trials_to_095"].get(s, "-"))
                                    for s in STRATEGIES),
                         r.get("quality_at_500", "-"), r.get("wall_s_500", "-")])
        out += table(["layer", "space", "exhaustive best us", "tuned / default (timed)",
                      "trials to 0.95x: " + " / ".join(STRATEGIES), "quality@500",
                      "wall s, 500 trials"], rows)
        out += [""]
        used += [f, *inputs]
    if kinds["tuning_timed"]:
        out += ["Timed tunes on the GPU (`lowbit.tune.tune`: crash-isolated worker, parallel "
                "compile, every candidate verified), per layer the latest:", ""]
        picked = latest_rows(kinds["tuning_timed"], lambda r: r.get("workload"))
        rows = []
        for f, r in picked:
            names = f.doc.get("templates") or [f.doc.get("template", "?")]
            default = r.get("default_us") or (r.get("defaults_us") or {}).get(
                r.get("best_template"))
            rows.append([r["workload"], ", ".join(IMPL.get(n, n) for n in names),
                         f.doc.get("strategy", "-"), r.get("trials", "-"),
                         r.get("space_size", "-"), r.get("wall_s", "-"),
                         f.link(f"{us(r['best_us'])} ({IMPL.get(r.get('best_template'), '')})"
                                .replace(" ()", "")), us(default),
                         ratio(default, r["best_us"]), r.get("failures", "-"), run_of(f)])
        out += table(*drop_same(["layer", "templates", "strategy", "trials", "space", "wall s",
                                 "best us", "default us", "default / best", "failures", "run"],
                                rows, "run"))
        out += [""]
        used += [f for f, _ in picked]
    out += [provenance(used), ""] if used else []
    if kinds["tuning_multigpu"]:
        out += [_multigpu_line(latest(kinds["tuning_multigpu"])), ""]
    return out

