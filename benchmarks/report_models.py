"""Renderers of the model-level suites (accuracy, autoprecision, wide realizations, the ONNX
bridge, QAT schedules, whole networks, network ops, performance model) and of the GPU test runs
and probes; registered on import."""

from __future__ import annotations

import math
import statistics

from report_core import (
    Result,
    by_gpu,
    drop_same,
    gpu_heading,
    latest,
    latest_rows,
    num,
    plural,
    provenance,
    ratio,
    run_of,
    short_sha,
    span,
    suite,
    table,
    us,
)


def paired(a: list[float], b: list[float]) -> str:
    """mean +- standard error of the per-seed differences a - b."""
    d = [x - y for x, y in zip(a, b, strict=True)]
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
    return f"{statistics.fmean(d):+.2f} +- {se:.2f}"


def _mean_std(r: dict) -> str:
    """A row's accuracy: mean +- std over seeds (mean alone where no std is given)."""
    accs = r.get("accuracies") or []
    mean = r.get("accuracy_mean", statistics.fmean(accs) if accs else None)
    if mean is None:
        return "-"
    std = r.get("accuracy_std")
    return f"{mean:.2f}" + ("" if std is None else f" +- {std:.2f}")


def _n_seeds(r: dict) -> int:
    return len(r.get("accuracies") or r.get("seeds") or [])


def _best_vs_brevitas(cells: dict[str, dict]) -> str:
    """The best lowbit method of a (dataset, model, precision) against the best Brevitas one:
    'method +d +- se', the paired per-seed difference; '' without both or without seeds."""
    def best(rows: list[dict]) -> dict | None:
        rows = [r for r in rows if r.get("accuracy_mean") is not None]
        return max(rows, key=lambda r: r["accuracy_mean"]) if rows else None

    ours = best([r for m, r in cells.items() if not m.startswith("brevitas")])
    theirs = best([r for m, r in cells.items() if m.startswith("brevitas")])
    if not ours or not theirs:
        return ""
    a, b = ours.get("accuracies") or [], theirs.get("accuracies") or []
    if len(a) != len(b) or len(a) < 2 or ours.get("seeds") != theirs.get("seeds"):
        return ""
    return f"{ours['method']} {paired(a, b)}"


def _target_text(targets: dict, details: dict) -> str:
    """Targets named `kind@where` grouped by kind: met in n of m, the misses with their paired
    difference where the file gives it; other targets by name and value."""
    kinds: dict[str, list[tuple[str, object]]] = {}
    for name, value in sorted(targets.items()):
        kind, _, where = name.partition("@")
        kinds.setdefault(kind, []).append((where, value))
    parts = []
    for kind, items in kinds.items():
        if not all(isinstance(v, bool) for _, v in items):
            parts += [f"`{kind}{'@' + w if w else ''}` {v}" for w, v in items]
            continue
        missed = []
        for where, ok in items:
            if not ok:
                d = details.get(f"{kind}@{where}" if where else kind) or {}
                extra = (f" {d.get('lowbit_best', '')} {d['paired_mean']:+.2f} +- "
                         f"{d.get('paired_se', math.nan):.2f}" if "paired_mean" in d else "")
                missed.append((where or kind) + extra.replace("  ", " "))
        text = f"`{kind}` met in {len(items) - len(missed)} of {len(items)}"
        parts.append(text + (f" (missed: {', '.join(missed)})" if missed else ""))
    return "; ".join(parts)


METHOD_LABEL = {"max": "MAX", "rand": "Rand", "rand+mix": "Rand+mix", "lsq": "LSQ",
                "pact": "PACT", "brevitas": "Brevitas"}


@suite("accuracy", "Quantization accuracy", "benchmarks/accuracy.py")
def render_accuracy(files: list[Result]) -> list[str]:
    """One row per (dataset, model, precision) with the methods as columns, from the latest run
    that has the (dataset, model) pair; FP32 once per pair; the targets of the runs shown."""
    owner: dict[tuple, Result] = {}
    for f in sorted(files, key=lambda f: f.order):
        for r in f.rows:
            owner[(r.get("dataset"), r.get("model"))] = f
    used = sorted(set(owner.values()), key=lambda f: f.order)
    setup = [k for k in ("dataset", "model") if any(k in r for f in used for r in f.rows)]
    methods: list[str] = []
    cells: dict[tuple, dict[str, dict[str, dict]]] = {}  # pair -> precision -> method -> row
    for pair, f in sorted(owner.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        for r in f.rows:
            if (r.get("dataset"), r.get("model")) == pair:
                method = r.get("method", "-")
                methods += [] if method in methods else [method]
                cells.setdefault(pair, {}).setdefault(r.get("precision", "-"), {})[method] = r
    fp32 = "fp32" in methods
    methods = [m for m in methods if m != "fp32"]
    rows, integer = [], []
    for pair, precs in cells.items():
        f, base = owner[pair], precs.get("fp32", {}).get("fp32")
        names = [str(p) if p is not None else "-"
                 for p, k in zip(pair, ("dataset", "model"), strict=True) if k in setup]
        for i, (prec, by) in enumerate((p, b) for p, b in precs.items() if p != "fp32"):
            rows.append([*(names if i == 0 else [""] * len(names)),
                         *([_mean_std(base) if i == 0 and base else ""] if fp32 else []),
                         f.link(prec), *(_mean_std(by[m]) if m in by else "-" for m in methods),
                         _best_vs_brevitas(by),
                         "/".join(str(n) for n in sorted({_n_seeds(r) for r in by.values()}
                                                         - {0})) or "-"])
            integer += [(pair, prec, m, r) for m, r in by.items() if "integer_accuracy_mean" in r]
    out = ["Test accuracy %, mean +- std over seeds, per (dataset, model) from the latest run "
           "that has it (FP32: the float model); best vs Brevitas: lowbit's most accurate "
           "method minus Brevitas's, paired per-seed difference, mean +- standard error.", ""]
    out += table([*setup, *(["FP32"] if fp32 else []), "precision",
                  *(METHOD_LABEL.get(m, m) for m in methods),
                  "best vs Brevitas", "seeds"], rows)
    differ = [" ".join(x for x in ("/".join(str(p) for p in pair if p is not None), prec, m,
                                   f"{r['accuracy_mean']:.3f} -> {r['integer_accuracy_mean']:.3f}")
                       if x)
              for pair, prec, m, r in integer if r["integer_accuracy_mean"] != r["accuracy_mean"]]
    if integer:
        out += ["", f"Integer model (`lowbit.convert`, exact integer layers): the same accuracy "
                f"in {len(integer) - len(differ)} of {len(integer)} cells"
                + (f"; differs in {', '.join(differ)}." if differ else ".")]
    for f in used:
        if targets := f.doc.get("targets") or {}:
            out += ["", f"Targets of {f.link(f.name)}: "
                    + _target_text(targets, f.doc.get("target_details") or {}) + "."]
    return [*out, "", provenance(used), ""]


def _seed_count(f: Result) -> int:
    """How many seeds a run has: its setup's count, else the longest row's seed list."""
    return int((f.doc.get("setup") or {}).get("seeds")
               or max((len(r.get("seeds") or []) for r in f.rows), default=0))


def _measured(f: Result) -> dict[str, list[float]]:
    """Per plan, the measured latencies (ms) of its seeds (`per_seed` entries)."""
    out: dict[str, list[float]] = {}
    for e in f.doc.get("per_seed") or []:
        if e.get("measured_latency_ms") is not None:
            out.setdefault(e["plan"], []).append(e["measured_latency_ms"])
    return out


@suite("autoprecision", "Per-layer precision (autoprecision)", "benchmarks/autoprecision.py")
def render_autoprecision(files: list[Result]) -> list[str]:
    """Accuracy from the run with the most seeds (the latest of those): the chosen plans and
    the uniform ones, predicted latency, bits and the paired difference of each chosen plan
    against each plan; measured latency per plan (median over seeds) from the latest run that
    measured it. Each table names its file, GPU and seed count."""
    f = max(files, key=lambda f: (_seed_count(f), f.order))
    setup = f.doc.get("setup", {})
    autos = [r["plan"] for r in f.rows if r.get("plan", "").startswith("auto")]
    rows = []
    for r in f.rows:
        diffs = [f"{r[f'{a} minus_mean']:+.2f} +- {r[f'{a} minus_se'] or math.nan:.2f}"
                 if f"{a} minus_mean" in r else "" for a in autos]
        rows.append([r.get("plan", "-"), f.link(f"{r['accuracy_mean']:.2f} +- "
                                               f"{r['accuracy_std']:.2f}"),
                     num(r.get("predicted_latency_us_mean"), 2),
                     num(r.get("avg_weight_bits_mean"), 2), *diffs])
    out = [f"{setup.get('dataset', '?')} / {setup.get('model', '?')}, {setup.get('method', '?')} "
           f"QAT, first and last layer float, batch {setup.get('batch', '?')}. Chosen plans "
           f"within uniform {setup.get('baseline')}'s latency or average weight bits; paired "
           "per-seed differences, mean +- standard error.", "",
           f"Accuracy: {f.link(f.name)}, {f.gpu}, {_seed_count(f)} seeds; latency "
           f"{setup.get('latency', '?')}.", ""]
    out += table(["plan", "accuracy %", "predicted us", "avg w bits",
                  *(f"{a} minus this" for a in autos)], rows)
    flags = {k: v for k, v in (f.doc.get("targets") or {}).items() if isinstance(v, bool)}
    if flags:
        out += ["", "Targets: " + "; ".join(f"`{k}` {'met' if v else 'missed'}"
                                           for k, v in sorted(flags.items())) + "."]
    out += ["", provenance([f]), ""]
    timed = [g for g in files if _measured(g)]
    if timed:
        g = latest(timed)
        rows = [[plan, g.link(f"{statistics.median(ms):.4f}"), f"{min(ms):.4f} - {max(ms):.4f}",
                 len(ms)] for plan, ms in _measured(g).items()]
        out += [f"Measured latency: {g.link(g.name)}, {g.gpu}, {_seed_count(g)} seeds (each "
                "seed's plan timed, CUDA graph), ms:", ""]
        out += table(["plan", "median ms", "range ms", "seeds"], rows)
        out += ["", provenance([g]), ""]
    return out


def _wide_groups(f: Result) -> list[tuple[tuple, list[dict]]]:
    """The run's rows by (precision, wide_bits), widest first per precision."""
    groups: dict[tuple, list[dict]] = {}
    for r in f.rows:
        groups.setdefault((r["precision"], r["wide_bits"]), []).append(r)
    return sorted(groups.items(), key=lambda kv: (kv[0][0], -kv[0][1]))


def summarize_wide_bits(files: list[Result]) -> str:
    """Per precision and width: the mean top-1 agreement and the accuracy change."""
    f = latest(files)
    setup = f.doc.get("setup", {})
    return (f"{setup.get('dataset', '?')} / {setup.get('model', '?')}: residual adds realized "
            "at `wide_bits`, the compiled plan's predictions against the converted integer "
            "model's on the test split, agreement % (accuracy change, points): " + "; ".join(
                f"{prec} {bits} bits {100 * statistics.fmean(r['top1_agreement'] for r in rs):.2f}"
                f" ({statistics.fmean(r['accuracy'] - r['integer_accuracy'] for r in rs):+.2f})"
                for (prec, bits), rs in _wide_groups(f))
            + f" over {plural(len({r.get('seed') for r in f.rows}), 'seed')}.")


@suite("wide_bits", "Wide realizations on trained models", "benchmarks/wide_bits.py",
       concluded=summarize_wide_bits)
def render_wide_bits(files: list[Result]) -> list[str]:
    """The latest run: per (precision, wide_bits), the top-1 agreement of the compiled plan
    with the converted integer model over seeds (min, mean), and the accuracy change."""
    f = latest(files)
    rows = []
    for (prec, bits), rs in _wide_groups(f):
        agree = [r["top1_agreement"] for r in rs]
        delta = [r["accuracy"] - r["integer_accuracy"] for r in rs]
        rows.append([prec, bits, f.link(f"{100 * statistics.fmean(agree):.2f}"),
                     f"{100 * min(agree):.2f}", f"{statistics.fmean(delta):+.2f}",
                     f"{max(r['max_logit_diff'] for r in rs):.3f}", len(rs)])
    setup = f.doc.get("setup", {})
    out = [f"{setup.get('dataset', '?')} / {setup.get('model', '?')}: residual adds realized at "
           "`wide_bits`, the compiled plan against the converted integer model on the test "
           "split (agreement: same predicted class, %).", ""]
    out += table(["precision", "wide bits", "agreement % (mean)", "min %",
                  "accuracy change (points)", "max logit diff", "seeds"], rows)
    return [*out, "", provenance([f]), ""]


@suite("onnx_bridge", "From ONNX Q/DQ (Brevitas) to lowbit's kernels", "benchmarks/onnx_bridge.py")
def render_onnx_bridge(files: list[Result]) -> list[str]:
    """Per GPU (or CPU): the latest run's agreement of the compiled model with Brevitas's own
    predictions on the test split, and its times against the float network in fp16."""
    out = []
    for gpu, group in by_gpu(files):
        f = latest(group)
        setup = f.doc.get("setup", {})
        out += [*gpu_heading(gpu, by_gpu(files)),
                f"{setup.get('model', '?')} on {setup.get('dataset', '?')}, "
                f"{setup.get('epochs', '?')} epochs of Brevitas QAT, Brevitas's "
                f"{setup.get('exporter', '?')} QCDQ export, `lowbit.from_onnx` then "
                "`lowbit.compile`; same predicted class as Brevitas's forward, %.", ""]
        rows = [[r["executor"], r["images"], f.link(f"{100 * r['compiled_agreement']:.2f}"),
                 f"{100 * r['fake_quant_agreement']:.2f}",
                 f"{100 * r['brevitas_accuracy']:.2f}", f"{100 * r['compiled_accuracy']:.2f}",
                 f"{r['compiled_max_logit_diff']:.2g}", r["float_fallbacks"]]
                for r in f.rows if r.get("kind") == "agreement"]
        out += table(["executor", "images", "compiled agreement %", "fake-quant agreement %",
                      "Brevitas accuracy %", "compiled accuracy %", "max logit diff",
                      "float steps"], rows)
        timed = [r for r in f.rows if r.get("kind") == "time"]
        if timed:
            out += ["", f"Forward time, ms ({setup.get('compile_mode', '?')} `torch.compile` "
                    "mode):", ""]
            out += table(["batch", "lowbit", "fp16 eager", "fp16 CUDA graph",
                          "fp16 torch.compile", "torch.compile / lowbit"],
                         [[r["batch"], f.link(num(r["lowbit_ms"], 4)),
                           *(num(r["baselines_ms"].get(k), 4) for k in
                             ("fp16_eager", "fp16_cuda_graph", "fp16_compile")),
                           num(r.get("speedup_vs_fp16_compile"), 2)] for r in timed])
        out += ["", provenance([f]), ""]
    return out


@suite("residual_bits", "Quantized residual stream on trained models",
       "benchmarks/residual_bits.py")
def render_residual_bits(files: list[Result]) -> list[str]:
    """The run with the most seeds (the latest of those): per (precision, residual setting),
    the fake-quant and compiled accuracy over seeds, the paired per-seed difference of the
    compiled accuracy against the 24-bit stream (residual_bits=None), and the agreement of the
    compiled plan with the fake-quant model."""
    f = max(files, key=lambda f: (len((f.doc.get("setup") or {}).get("seeds") or []), f.order))
    summary = f.doc.get("summary") or {}
    groups: dict[tuple, list[dict]] = {}
    for r in f.rows:
        groups.setdefault((r["precision"], r["residual_bits"]), []).append(r)
    rows = []
    for (prec, bits), rs in sorted(groups.items(), key=lambda kv: (
            kv[0][0], kv[0][1] is not None, -(kv[0][1] or 0))):
        fake, comp = ([r[k] for r in rs] for k in ("accuracy", "compiled_accuracy"))
        agree = [r["agreement"] for r in rs]
        d = (summary.get(prec, {}).get(f"{bits}_minus_none") or {}).get("compiled")
        rows.append([prec, "none (24-bit stream)" if bits is None else bits,
                     f"{statistics.fmean(fake):.2f} +- "
                     f"{statistics.stdev(fake) if len(fake) > 1 else 0.0:.2f}",
                     f.link(f"{statistics.fmean(comp):.2f}"),
                     "-" if d is None else f"{d['mean']:+.2f} +- {d['se']:.2f} (std "
                     f"{d['std']:.2f})",
                     f"{100 * statistics.fmean(agree):.2f}", f"{100 * min(agree):.2f}", len(rs)])
    setup = f.doc.get("setup", {})
    out = [f"{setup.get('dataset', '?')} / {setup.get('model', '?')}, "
           f"{setup.get('method', '?')} QAT from the same FP32 model and data order per seed, "
           "first and last layer float: `residual_bits` quantizes the values residual adds "
           "read in the model (none: float in the model, 24 bits wide in the plan). Compiled: "
           "the plan through the reference executor on the test split; paired: per-seed "
           "compiled accuracy minus the 24-bit stream's, mean +- standard error; agreement: "
           "compiled prediction = fake-quant prediction, %.", ""]
    out += table(["precision", "residual bits", "fake-quant % (+- std)", "compiled %",
                  "paired vs 24-bit (points)", "agreement % (mean)", "min %", "seeds"], rows)
    flags = {k: v for k, v in (f.doc.get("targets") or {}).items() if isinstance(v, bool)}
    if flags:
        out += ["", "Targets: " + "; ".join(f"`{k}` {'met' if v else 'missed'}"
                                           for k, v in sorted(flags.items())) + "."]
    return [*out, "", provenance([f]), ""]


def _schedule(r: dict) -> str:
    """A sweep row's QAT schedule: epochs, learning rate, distillation weight."""
    return (f"{r.get('qat_epochs', '?')} ep, lr {r.get('qat_lr', '?'):g}"
            + (f", KD {r['distill']:g}" if r.get("distill") else ""))


def _sweep_cells(f: Result) -> tuple[list[str], dict[tuple, dict[str, dict]]]:
    """The sweep's schedules in file order and its rows by (dataset, model, precision,
    method) and schedule."""
    rows = [r for r in f.rows if isinstance(r, dict) and "paired_minus_fp32_mean" in r]
    cells: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        key = (r.get("dataset", "-"), r.get("model", "-"), r.get("precision", "-"),
               r.get("method", "-"))
        cells.setdefault(key, {})[_schedule(r)] = r
    return list(dict.fromkeys(_schedule(r) for r in rows)), cells


def _paired_fp32(r: dict, seeds: bool = True) -> str:
    return (f"{r['paired_minus_fp32_mean']:+.2f} +- {r.get('paired_minus_fp32_se', 0):.2f}"
            + (f" ({r.get('n_seeds', '?')})" if seeds else ""))


def summarize_accuracy_sweep(files: list[Result]) -> str:
    """Per (dataset, model, precision) the best (method, schedule), and that method at the
    first schedule."""
    schedules, cells = _sweep_cells(latest(files))
    best: dict[tuple, tuple[str, str, dict]] = {}
    for (*setup, method), by in sorted(cells.items()):
        for sch, r in by.items():
            k = tuple(setup)
            if k not in best or r["paired_minus_fp32_mean"] > best[k][2][
                    "paired_minus_fp32_mean"]:
                best[k] = (method, sch, r)
    datasets = {k[0] for k in best}
    parts = []
    for (dataset, model, prec), (method, sch, r) in best.items():
        first = cells[(dataset, model, prec, method)].get(schedules[0])
        parts.append(" ".join(x for x in (dataset if len(datasets) > 1 else "", model, prec,
                                          method, sch) if x) + " " + _paired_fp32(r, False)
                     + (f" ({_paired_fp32(first, False)})" if first and first is not r else ""))
    return ((f"{next(iter(datasets))}: " if len(datasets) == 1 else "")
            + "per model and precision the most accurate (method, QAT schedule), paired "
            "per-seed difference to FP32 in points, mean +- standard error (in brackets: that "
            f"method at {schedules[0]}): " + "; ".join(parts) + ".")


@suite("accuracy_sweep", "QAT schedule sweep on the harder digits",
       "benchmarks/accuracy.py (--qat-epochs / --qat-lr / --distill)",
       concluded=summarize_accuracy_sweep)
def render_accuracy_sweep(files: list[Result]) -> list[str]:
    """Rows {dataset, model, precision, method, qat_epochs, qat_lr, distill, n_seeds,
    paired_minus_fp32_mean / _se}: per (model, precision, method) a row, per schedule a
    column, from the latest file."""
    out = ["Paired per-seed difference to FP32 in accuracy points, mean +- standard error "
           "(seeds), per QAT schedule (the FP32 model of each seed is the same in every "
           "schedule).", ""]
    f = latest(files)
    schedules, cells = _sweep_cells(f)
    body = [[*key, *(_paired_fp32(cells[key][sch]) if sch in cells[key] else "-"
                     for sch in schedules)] for key in sorted(cells)]
    out += [f"File: {f.link(f.name)}.", ""]
    out += table(["dataset", "model", "precision", "method", *schedules], body)
    return [*out, "", provenance([f]), ""]


def _mix_rows(files: list[Result]) -> dict[tuple, tuple[Result, dict, dict]]:
    """Per (model, QAT steps, warm-up, seeds, precision) the latest run's (file, rand row,
    rand + mix row)."""
    latest_of: dict[tuple, tuple[Result, dict, dict]] = {}
    for f in sorted(files, key=lambda f: f.order):
        setup = f.doc.get("setup", {})
        by = {(r["precision"], r["method"]): r for r in f.rows if isinstance(r, dict)}
        for (prec, method), r in sorted(by.items()):
            if method == "rand+mix":
                key = (setup.get("model", "-"), setup.get("qat_steps", "-"),
                       setup.get("mix_warmup", "-"), setup.get("seeds", "-"), prec)
                latest_of[key] = (f, by.get((prec, "rand"), {}), r)
    return latest_of


def _mix_gain(r: dict) -> str:
    return (f"{r.get('paired_minus_rand_mean', 0):+.2f} +- "
            f"{r.get('paired_minus_rand_se', 0):.2f}")


def summarize_qat_schedule(files: list[Result]) -> str:
    """Per precision the mix - no mix differences of every setting, and how many exceed two
    standard errors."""
    rows = _mix_rows(files)
    by_prec: dict[str, list[dict]] = {}
    for key, (_, _, r) in rows.items():
        by_prec.setdefault(key[-1], []).append(r)
    beyond = sum(abs(r.get("paired_minus_rand_mean", 0)) > 2 * r.get("paired_minus_rand_se", 0)
                 for _, _, r in rows.values())
    settings = len({key[:-1] for key in rows})
    return ("The README recipe (`method=\"rand\"`) with and without `mix`, same seeds: mix - "
            "no mix in accuracy points +- standard error, over "
            f"{plural(settings, 'setting')} (model, QAT steps, warm-up, seeds): " + "; ".join(
                f"{prec} " + ", ".join(_mix_gain(r) for r in rs)
                for prec, rs in sorted(by_prec.items())) +
            f"; {beyond} of {len(rows)} beyond two standard errors.")


@suite("qat_schedule", "Adaptive precision (mix) schedules", "benchmarks/qat_schedule.py",
       concluded=summarize_qat_schedule)
def render_qat_schedule(files: list[Result]) -> list[str]:
    """Rows {precision, method, accuracy_mean, accuracy_std, paired_minus_rand_mean / _se} of
    the README recipe with and without mix: per (model, QAT steps, warm-up, seeds, precision)
    the latest run (runs with other settings are an ablation, each keeps its rows)."""
    out = ["The README recipe (`method=\"rand\"`) with and without `mix`, same seeds; "
           "paired difference mix - no mix in accuracy points +- its standard error.", ""]
    rows = [[*key, f"{rand.get('accuracy_mean', float('nan')):.2f}",
             f.link(f"{r['accuracy_mean']:.2f}"), _mix_gain(r), run_of(f)]
            for key, (f, rand, r) in _mix_rows(files).items()]
    out += table(*drop_same(["model", "QAT steps", "warm-up", "seeds", "precision", "rand %",
                             "rand + mix %", "mix - no mix", "run"], rows, "run"))
    return [*out, "", provenance({f for f, _, _ in _mix_rows(files).values()}), ""]


def _policy(r: dict) -> str:
    """The row's per-layer implementation policy (`impl_chooser`'s name; "default" where the
    row does not say), with "no fused outputs" where int8 layers left their layer epilogue
    to the separate pass, "approx. 32-bit" where the plan took the approximate 32-bit
    requantizations (`PlanOptions.requant32`; rows that do not say are exact), "plain
    64-bit" where exact block ends took no guarded form (`PlanOptions.guarded_block_ends`)
    and the stem kernel the row asked for (`PlanOptions.stem_kernel`)."""
    name = r.get("chooser", "default")
    name = name if r.get("fuse_outputs", True) else f"{name}, no fused outputs"
    name = f"{name}, approx. 32-bit" if r.get("requant32") is True else name
    name = f"{name}, plain 64-bit" if r.get("guarded_block_ends") is False else name
    return f"{name}, {r['stem_kernel']} stem" if r.get("stem_kernel") else name


def _network_key(r: dict) -> tuple | None:
    """A network row's key: model, batch, precision, bias mode, the width of its residual
    adds (24 bits where the row does not say) and the policy; None for rows without a time
    (errors)."""
    if not r.get("time_ms"):
        return None
    return (r["model"], r["batch"], r["precision"], r.get("exact_bias", True),
            r.get("wide_bits", 24), _policy(r))


def _clipped(text: str, most: int = 56) -> str:
    """A step's kernel description cut to `most` characters (the results file has it all)."""
    return text if len(text) <= most else text[:most - 3].rstrip() + "..."


def _largest_steps(runs: list[tuple[Result, dict]], n: int = 3) -> list[str]:
    """Each run's `n` slowest steps in one table: impl, time, the alone time of each launch of
    multi-launch steps (a column only where a step has them), roofline floor and the fp16 time
    of the same layers (us)."""
    rows = []
    for f, r in runs:
        layers = sorted((x for x in r.get("layers") or [] if x.get("time_us")),
                        key=lambda x: -x["time_us"])[:n]
        rows += [[r["precision"], x.get("name", "-"), _clipped(x.get("impl", "-")),
                  f.link(us(x["time_us"])),
                  " + ".join(us(t) for t in x.get("launches_us") or []) or "-",
                  us(x.get("floor_us")), us(x.get("fp16_us"))] for x in layers]
    if not rows:
        return []
    r = runs[0][1]
    dates = ", ".join(dict.fromkeys(f.date for f, _ in runs))
    header = ["prec", "step", "impl", "us", "launches us", "floor us", "fp16 us"]
    if all(row[4] == "-" for row in rows):
        header, rows = header[:4] + header[5:], [row[:4] + row[5:] for row in rows]
    return [f"Largest steps of {r['model']} b{r['batch']} (exact bias, wide "
            f"{r.get('wide_bits', 24)}), {dates}: us in the engine, floor, fp16 us of the same "
            "layers" + (", per-launch alone us of multi-launch steps" if "launches us" in header
                        else "") + ".", "", *table(header, rows), ""]


def _fraction(ours: float | None, fp16: float | None) -> str:
    """ours / fp16 (bytes) to two decimals, "-" where either is missing."""
    return f"{ours / fp16:.2f}" if ours and fp16 else "-"


def _current_policies(picked: list[tuple[Result, dict]]) -> list[tuple[Result, dict]]:
    """The default policy's rows, and the other policies' rows that are no older than the
    default row of their (model, batch, precision, bias, wide): an ablation measured before
    the default changed describes code that no longer runs (NOTES.md keeps it)."""
    newest: dict[tuple, tuple] = {}
    for f, r in picked:
        if _policy(r) == "default":
            newest[_network_key(r)[:5]] = f.order
    return [(f, r) for f, r in picked
            if _policy(r) == "default" or _network_key(r)[:5] not in newest
            or f.order >= newest[_network_key(r)[:5]]]


#: the baselines of network rows (`baselines_ms`) in column order, with their labels; a row's
#: other baselines follow as columns of their own key
NETWORK_BASELINES = {"fp16_eager": "fp16 eager", "fp16_cuda_graph": "fp16 CUDA graph",
                     "fp16_compile": "torch.compile"}


TARGET_STATE = {True: "met", False: "missed"}


def _network_targets(f: Result) -> list[str]:
    """The targets a network run checked ({name, value, bound, met}), in one line."""
    targets = [t for t in f.doc.get("targets") or [] if isinstance(t, dict) and "name" in t]
    if not targets:
        return []

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    states = {t.get("met") for t in targets}
    values: dict[tuple, list[str]] = {}  # (name, bound): values, one per target of that name
    for t in targets:
        values.setdefault((t["name"], fmt(t.get("bound"))), []).append(
            fmt(t.get("value")) + ("" if len(states) == 1
                                   else f" {TARGET_STATE.get(t.get('met'), 'n/a')}"))
    items = [f"{name} {bound}: {', '.join(v)}" for (name, bound), v in values.items()]
    every = f"; all {TARGET_STATE.get(states.pop(), 'n/a')}" if len(states) == 1 else ""
    return [f"Targets of {f.link(f.name)} (bound: value): " + "; ".join(items) + every + ".", ""]


@suite("network", "Whole networks", "benchmarks/network.py")
def render_network(files: list[Result]) -> list[str]:
    """benchmarks/network.py's rows: {model, batch, precision, exact_bias, wide_bits, time_ms,
    images_per_s, baselines_ms: {fp16_eager, fp16_cuda_graph, fp16_compile}, floor_ms,
    host_overhead_us, host_overhead_bound_us, layers: [{name, impl, time_us, launches_us,
    floor_us, fp16_us}]}."""
    out = ["Per model, batch, precision, bias, wide and policy the latest run (errors left out); "
           "ratios to the same run's baselines. Bias: `exact` keeps each output's bias at its "
           "shift (separate epilogue pass), `kernel` rounds it to accumulator units. Wide: the "
           "bits of the residual adds' accumulators. Policy: how layers pick their "
           "implementation (`default`: `lowbit.compile`'s; `model`: the performance model's; a "
           "template: it first; `no fused outputs`: int8 layers leave their layer epilogue to "
           "the separate pass), others only where no newer default row exists. Floor: the sum "
           "of the layers' roofline floors. Host: a forward call's host time (in brackets: "
           "`input_buffer`, `copy_output=False`). Weights, peak activations: bytes against the "
           "fp16 model's.", ""]
    groups = by_gpu(files)
    for gpu, group in groups:
        picked = _current_policies(latest_rows(group, _network_key))
        if not picked:
            continue
        picked = sorted(picked, key=lambda fr: (
            str(fr[1]["model"]), fr[1]["batch"], fr[1]["precision"],
            not fr[1].get("exact_bias", True), -fr[1].get("wide_bits", 24),
            _policy(fr[1]) != "default", _policy(fr[1])))
        baselines = [*NETWORK_BASELINES, *sorted({k for _, r in picked
                                                 for k in r.get("baselines_ms") or {}}
                                                - set(NETWORK_BASELINES))]
        rows = []
        for f, r in picked:
            b, t = r.get("baselines_ms") or {}, r["time_ms"]
            rows.append([r["model"], r["batch"], r["precision"],
                         "exact" if r.get("exact_bias", True) else "kernel",
                         r.get("wide_bits", 24), _policy(r), f.link(f"{t:.3f}"),
                         f"{r.get('images_per_s', 0):,.0f}",
                         *(ratio(b.get(k), t) for k in baselines),
                         f"{r['floor_ms']:.3f}" if r.get("floor_ms") else "-",
                         us(r.get("host_overhead_us")) + (
                             f" ({r['host_overhead_bound_us']:.1f})"
                             if r.get("host_overhead_bound_us") else ""),
                         _fraction(r.get("weights_bytes"), r.get("fp16_weights_bytes")),
                         _fraction(r.get("peak_activation_bytes"),
                                   r.get("fp16_peak_activation_bytes")), run_of(f)])
        out += gpu_heading(gpu, groups)
        out += table(*drop_same(["model", "batch", "precision", "bias", "wide", "policy", "ms",
                                 "images/s",
                      *(f"{NETWORK_BASELINES.get(k, k)} / ours" for k in baselines),
                      "floor ms", "host us", "weights / fp16", "peak activations / fp16",
                      "run"], rows, "run"))
        out += ["", provenance(f for f, _ in picked), ""]
        out += _largest_steps([big[-1] for precision in ("w1a2", "w8a8") if (big := [
            (f, r) for f, r in picked
            if _network_key(r) == ("resnet50", 256, precision, True, 24, "default")])])
        out += _network_targets(latest(group))
    return out


def _netops_rows(files: list[Result]) -> list[tuple[Result, dict]]:
    return latest_rows(files, lambda r: (r["op"], r["workload"], r["batch"], r["impl"]))


def summarize_netops(files: list[Result]) -> str:
    """Per op and implementation: the ranges of time, time / floor and fp16 / ours over its
    workloads and batches."""
    by: dict[tuple, list[tuple[float, dict]]] = {}
    for _, r in _netops_rows(files):
        by.setdefault((r["op"], r["impl"]), []).append((r.get("graph_us") or r["time_us"], r))
    return ("CUDA-graph times against PyTorch fp16 of the same run (same op in fp16, "
            "channels_last), per op over its workloads and batches: us, x floor, fp16 / ours: "
            + "; ".join(f"{op} ({impl}, {len(ts)}) {span((t for t, _ in ts), us)}, "
                        + span((t / r["floor_us"] for t, r in ts if r.get("floor_us")),
                               "{:.1f}".format) + "x, "
                        + span((fp16 / t for t, r in ts
                                if (fp16 := (r.get("baselines_us") or {}).get("fp16_cuda_graph"))),
                               "{:.2f}".format)
                        for (op, impl), ts in by.items()) + ".")


@suite("netops", "Network ops and the fused first layer", "benchmarks/netops.py",
       concluded=summarize_netops)
def render_netops(files: list[Result]) -> list[str]:
    """Rows {op, workload, batch, impl, time_us, graph_us, floor_us, baselines_us}: the
    packed-domain kernels (epilogue, pools, image quantization) and the first layer."""
    out = ["Per op, workload and batch the latest run; CUDA-graph times, PyTorch fp16 of the "
           "same run (same op in fp16, channels_last).", ""]
    groups = by_gpu(files)
    for gpu, group in groups:
        picked = _netops_rows(group)
        rows = []
        for f, r in picked:
            t = r.get("graph_us") or r.get("time_us")
            b = r.get("baselines_us") or {}
            rows.append([r["op"], r["workload"], r["batch"], r["impl"], f.link(us(t)),
                         us(r.get("floor_us")), ratio(t, r.get("floor_us")),
                         us(b.get("fp16_cuda_graph")), ratio(b.get("fp16_cuda_graph"), t),
                         run_of(f)])
        out += gpu_heading(gpu, groups)
        out += table(*drop_same(["op", "workload", "batch", "impl", "us", "floor us", "/ floor",
                      "fp16 graph us", "fp16 / ours", "run"], rows, "run"))
        out += ["", provenance(f for f, _ in picked), ""]
    return out


MODEL_LABEL = {"learned_anchored": "learned + 1 measured config"}


def _ape_tau(f: Result, r: dict) -> str:
    return f"{f.link(num(r.get('median_ape'), 1))} ({num(r.get('kendall_tau'), 2)})"


def _model_accuracy_table(acc: list[tuple[Result, dict]]) -> list[str]:
    """One row per (template, data) with the models as columns: median APE % (Kendall tau);
    layers and configs of the row's first model."""
    models = list(dict.fromkeys(r.get("model", "-") for _, r in acc))
    cells: dict[tuple, dict[str, tuple[Result, dict]]] = {}
    for f, r in acc:
        cells.setdefault((r["template"], r.get("data", "-")), {})[r.get("model", "-")] = (f, r)
    rows = []
    for (template, data), by in cells.items():
        figures = [_ape_tau(*by[m]) if m in by else "-" for m in models]
        first = next(iter(by.values()))[1]
        rows.append([template, data, *figures, first.get("n_layers", "-"),
                     first.get("n_configs", "-")])
    if not rows:
        return []
    return [*table(["template", "data",
                    *(f"{MODEL_LABEL.get(m, m)}: APE % (tau)" for m in models),
                    "layers", "configs"], rows), ""]


def _accuracy_key(r: dict) -> tuple | None:
    return (r["template"], r.get("model"), r.get("data")) \
        if r.get("kind") == "model_accuracy" else None


def _pruned_key(r: dict) -> tuple | None:
    return (r["template"], r["workload"]) if r.get("kind") == "pruned_tuner" else None


def _dispatch_key(r: dict) -> str | None:
    return r["workload"] if r.get("kind") == "dispatch" else None


def _exhaustive_spaces(pruned: list[tuple[Result, dict]]) -> list[str]:
    """The pruned tuner on whole spaces of 1,000+ configs (every config built, verified and
    timed: `tuning.py measure`), one row each."""
    rows = [[r["template"], r.get("layer") or r["workload"][:40], r["space_size"],
             r.get("space_failed", "-"), f.link(num(r["fraction_measured_to_097"], 4)),
             r.get("trials_to_097", "-"), num(r.get("random_fraction_to_097"), 3)]
            for f, r in pruned if r.get("exhaustive") and r["space_size"] >= 1000]
    if not rows:
        return []
    return ["Exhaustive spaces of 1,000+ configs:", "",
            *table(["template", "layer", "configs", "failed", "fraction to 0.97x",
                    "measurements", "random search's fraction"], rows), ""]


def _dispatch_summary(disp: list[dict]) -> list[str]:
    """Zero-tuning dispatch (the model's pick) and dispatch with three measurements
    (`choose_measured`: the fastest of the model's top three) against the best measured
    config of each layer's sample and cuDNN / cuBLAS fp16."""
    def line(label: str, key: str, over_key: str) -> str:
        over = [r[over_key] for r in disp if r.get(over_key)]
        slower = sum(1 for r in disp if r.get(key) and r.get("cudnn_fp16_us")
                     and r[key] > r["cudnn_fp16_us"])
        return (f"{label}: {len(over)} layers, median / best measured "
                f"{statistics.median(over):.2f}x, {sum(x <= 1.25 for x in over)} within "
                f"1.25x; slower than cuDNN / cuBLAS fp16 on {slower}.")
    out = [line("Zero-tuning dispatch", "dispatch_us", "dispatch_over_tuned")]
    if any(r.get("measured_top3_over_tuned") for r in disp):
        out.append(line("Dispatch with three measurements (the model's top three timed)",
                        "measured_top3_us", "measured_top3_over_tuned"))
    return [" ".join(out), ""]


def _ranges(acc: list[tuple[Result, dict]]) -> str:
    """Per model: the range of the median APE % (Kendall tau) over the templates."""
    by: dict[str, list[dict]] = {}
    for _, r in acc:
        by.setdefault(r.get("model", "-"), []).append(r)
    return ", ".join(f"{MODEL_LABEL.get(m, m)} "
                     f"{span((r.get('median_ape') for r in rs), '{:.1f}'.format, ' .. ')} "
                     f"({span((r.get('kendall_tau') for r in rs), '{:.2f}'.format, ' .. ')})"
                     for m, rs in by.items())


def summarize_perfmodel(files: list[Result]) -> str:
    """Per GPU (or offline data): the models' APE ranges over the templates, the pruned
    tuner's and the dispatch's summary lines."""
    parts = []
    for gpu, group in by_gpu(files):
        acc = latest_rows(group, _accuracy_key)
        pruned = latest_rows(group, _pruned_key)
        disp = latest_rows(group, _dispatch_key)
        text = [f"{gpu}:"]
        if acc:
            data = ", ".join(dict.fromkeys(str(r.get("data", "-")) for _, r in acc))
            n = len({r["template"] for _, r in acc})
            text.append(f"held-out median APE % (Kendall tau) over {plural(n, 'template')} "
                        f"({data}): {_ranges(acc)}.")
        if pruned:
            text.append(_pruned_line(pruned))
            big = [(r, f) for f, r in pruned if r.get("exhaustive") and r["space_size"] >= 1000]
            if big:
                text.append("On exhaustive spaces of 1,000+ configs: " + ", ".join(
                    f"{num(r['fraction_measured_to_097'], 3)} of {r['space_size']} "
                    f"(random search {num(r.get('random_fraction_to_097'), 3)})"
                    for r, _ in big) + ".")
        if disp:
            text += _dispatch_summary([r for _, r in disp])[:1]
        parts.append(" ".join(text))
    return ("Learned model: XGBoost, absolute error of the log time ratio, leave one layer "
            "out; \"learned + 1 measured config\": rescaled by one measurement. "
            + " ".join(parts))


def _pruned_line(pruned: list[tuple[Result, dict]]) -> str:
    fr = [r["fraction_measured_to_097"] for _, r in pruned
          if r["fraction_measured_to_097"] is not None]
    return (f"Pruned tuner: {len(fr)} spaces, median fraction of the space measured to "
            f"reach 0.97x of the best {statistics.median(fr):.3f} (max {max(fr):.3f}), "
            f"{sum(x <= 0.10 for x in fr)} of {len(fr)} at or under 10%.")


@suite("perfmodel", "Performance model", "benchmarks/perfmodel.py", concluded=summarize_perfmodel)
def render_perfmodel(files: list[Result]) -> list[str]:
    """Rows of kind model_accuracy {template, median_ape, kendall_tau, n_layers, n_configs},
    pruned_tuner {template, workload, space_size, fraction_measured_to_097} and dispatch
    {workload, template, dispatch_us, tuned_us, dispatch_over_tuned, cudnn_fp16_us}."""
    out = ["Held-out accuracy (leave one layer out on recorded data; fresh shapes in GPU runs), "
           "the pruned tuner's replays and zero-tuning dispatch; latest run per row. Learned "
           "model: XGBoost, absolute error of the log time ratio; \"learned + 1 measured "
           "config\": each held-out workload's predictions rescaled by one measurement (the "
           "config predicted fastest), scored on the others.", ""]
    groups = by_gpu(files)
    for gpu, group in groups:
        acc = latest_rows(group, _accuracy_key)
        pruned = latest_rows(group, _pruned_key)
        disp = latest_rows(group, _dispatch_key)
        if not (acc or pruned or disp):
            continue
        out += gpu_heading(gpu, groups)
        out += _model_accuracy_table(acc)
        if pruned:
            out += [_pruned_line(pruned), ""]
            out += _exhaustive_spaces(pruned)
        if disp:
            out += _dispatch_summary([r for _, r in disp])
        out += [provenance({f for f, _ in acc + pruned + disp}), ""]
    return out



def _test_files(files: list[str]) -> str:
    names = [f.removeprefix("tests/").removesuffix(".py") for f in files]
    return ", ".join(names[:4]) + (f" +{len(names) - 4}" if len(names) > 4 else "") or "-"


#: device calls whose GPU test runs the table shows (per GPU)
GPU_TEST_RUNS = 3


@suite("gpu_tests", "GPU tests", "benchmarks/gpu_tests_summary.py")
def render_gpu_tests(files: list[Result]) -> list[str]:
    """Rows {step, files, passed, failed, errors, skipped, duration_s, complete}: one pytest
    run of a device call each (its JUnit XML, or its log for older calls); the latest
    GPU_TEST_RUNS calls per GPU."""
    out = ["`pytest -m gpu` runs of the latest device calls; \"(cut)\": counted from the "
           "progress marks of a log cut before pytest's summary.", ""]
    groups = by_gpu(files)
    for gpu, group in groups:
        picked = sorted(group, key=lambda f: f.order)[-GPU_TEST_RUNS:]
        rows = [[f.stamp, short_sha(f.versions.get("lowbit", "-")), r.get("step", "-"),
                 _test_files(r.get("files") or []), f.link(str(r["passed"])),
                 f"{r['failed']} / {r['errors']}", r["skipped"],
                 num(r.get("duration_s"), 0) + ("" if r.get("complete", True) else " (cut)")]
                for f in picked for r in f.rows]
        out += gpu_heading(gpu, groups)
        out += table(["run", "lowbit", "step", "test files", "passed", "failed / errors",
                      "skipped", "s"], rows)
        out += ["", provenance(picked), ""]
    return out


@suite("probes", "Probes", "benchmarks/probes/", benchmarks=("*_probe", "*_probe_*"))
def render_probes(files: list[Result]) -> list[str]:
    """Files of the measurement-only probes (`<probe>-<stamp>.json`, rows of their own
    shape): the latest of each probe linked, the count of earlier ones (their files stay under
    benchmarks/results/<gpu>/); NOTES.md quotes what they showed."""
    out = []
    for gpu, group in sorted(by_gpu(files)):
        probes: dict[str, list[Result]] = {}
        for f in sorted(group, key=lambda f: f.order):
            probes.setdefault(f.benchmark, []).append(f)
        runs = "; ".join(f"`{name}` {fs[-1].link(fs[-1].stamp or fs[-1].name)}"
                         + (f" (+{len(fs) - 1} earlier)" if len(fs) > 1 else "")
                         for name, fs in sorted(probes.items()))
        out += [f"Outputs that NOTES.md quotes, {gpu}: {runs}.", ""]
    return out


@suite("tuning_network", "Whole-network tuning sessions", "benchmarks/tune_network.py")
def render_tuning_network(files: list[Result]) -> list[str]:
    """Per GPU: the latest session per (model, batch, precision, residual bits): its GPUs,
    budget, wall time, trials and failures, and the network's time (CUDA-graph replay, same
    process) with the default configs, the tuned ones and the performance model's plan."""
    out = []
    for gpu, group in by_gpu(files):
        sessions: dict[tuple, tuple[Result, dict]] = {}
        for f in sorted(group, key=lambda f: f.order):
            for r in f.rows:
                if r.get("row") == "tuning":
                    key = (r["model"], r["batch"], r["precision"], r.get("residual_bits"))
                    sessions[key] = (f, r)
        rows = []
        for (model, batch, prec, res), (f, r) in sessions.items():
            before, after = r.get("network_ms_before"), r.get("network_ms_after")
            model_ms = r.get("network_ms_model")
            rows.append([model, batch, prec + (f"/res{res}" if res else ""), r["gpus"],
                         num(r["budget_s"], 0), num(r["tune_wall_s"], 0),
                         f"{r['trials']} / {r['failures']}", r["workloads"],
                         num(before, 3), f.link(num(after, 3)), ratio(before, after),
                         num(model_ms, 3), ratio(model_ms, after),
                         "yes" if r.get("tuned_logits_equal") else "NO"])
        out += [*gpu_heading(gpu, by_gpu(files)),
                "`lowbit tune --model` (pruned tuner), then the network timed in the same "
                "process with default configs, tuned ones and the performance model's; ms.",
                ""]
        out += table(["model", "batch", "precision", "GPUs", "budget s", "wall s",
                      "trials / failed", "workloads", "default", "tuned", "speedup", "model",
                      "model / tuned", "same logits"], rows)
        out += ["", provenance([f for f, _ in sessions.values()]), ""]
    return out
