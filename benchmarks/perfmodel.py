"""Performance models (issue 34): held-out accuracy, the pruned tuner, zero-tuning dispatch.

Offline (default; CPU, from the recorded measurements under benchmarks/results: its results
files and the consolidated measurements.jsonl.gz of the files that left the tree):
  model_accuracy rows   leave-one-layer-out accuracy per template of the learned model, of the
                        learned model anchored by one measured config per held-out workload
                        ("learned_anchored": the predicted-fastest one; the others scaled by
                        its measured / predicted time), and of the analytic model alone
                        (`lowbit.perfmodel.evaluate`), and of the calibrated fp16 estimate
                        (leave one layer out of its calibration)
  pruned_tuner rows     per measured space of >= 100 configs (--min-space): measurements the
                        pruned tuner (`lowbit.tune.strategies.pruned`, model trained without
                        that layer) needs to reach 0.97x of the space's best, as a fraction of
                        the space, beside random search's expected fraction; "exhaustive": true
                        where a tables file (benchmarks/tuning.py measure) timed every config
                        of the template's space (the 1,000+ config TMA int8 and bit-serial spaces of
                        benchmarks/space_session.sh; --pruned-only: these rows alone)
  --export-snapshot     rewrites the packaged measurement snapshot the default model trains on
  --calibrate           prints the analytic constants fitted to the data

GPU (--gpu; <= 5 minutes on an H100): on every shared workload and 26 new layer shapes at w8a8
(and a few at w1a2), measures each template's default config, the model's top picks and a
random config through `lowbit.tune.LocalMeasurer` (built, checked bit for bit against
`lowbit.reference`, timed in a crash-isolated worker; a failure is a recorded row), times
cuDNN / cuBLAS fp16, and writes
  measurement rows      every candidate (future training data)
  dispatch rows         {workload, template, dispatch_us, tuned_us (best measured in the
                        sample), dispatch_over_tuned, cudnn_fp16_us, engine_*,
                        measured_top3_us / _over_tuned: dispatch with three measurements,
                        `lowbit.tune.dispatch.choose_measured`}
  model_accuracy rows   the default model on the fresh measurements (held out: the layers
                        its training snapshot lacks)
  sampling rows         the thesis's 2x / 3x saturation sampling vs the measured time

    python benchmarks/perfmodel.py [--quick] [--out DIR] [--export-snapshot] [--calibrate]
    python benchmarks/perfmodel.py --templates triton.gemm_int8 --max-layers 8 --no-pruned
                                  (while iterating: a part of the evaluation in seconds)
    python benchmarks/perfmodel.py --pruned-only [--min-space 1000]  (the replays, ~20 s)
    python benchmarks/perfmodel.py --gpu [--budget-s 230] [--out DIR] [--no-bitserial]

Results: benchmarks/results/<gpu>/perfmodel-<stamp>.json ("benchmark": "perfmodel"); a short
table is printed last.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import random
import statistics
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lowbit.core import Config, ConvWorkload, Epilogue, GemmWorkload, Workload, load_workloads
from lowbit.core.workloads import SUITES
from lowbit.kernels.base import TORCH_FP16
from lowbit.kernels.cuda import FAMILIES
from lowbit.perfmodel import fit as cal
from lowbit.perfmodel.dataset import (
    SNAPSHOT,
    Measurement,
    deduplicate,
    int8_workload,
    load_results,
    save_snapshot,
    summary,
)
from lowbit.perfmodel.evaluate import accuracy, learned_fit, leave_one_layer_out, memoized

ROOT = Path(__file__).resolve().parent.parent
H100_NAME = "NVIDIA H100 80GB HBM3"
BITPLANE_EPI = Epilogue(bias=True, relu=True, out="u2", out_layout="bitplane")

#: new layer shapes (issue 34): MobileNet / EfficientNet pointwise, YOLO, DenseNet, U-Net,
#: odd channels, batch 1, non-square maps, 5x5, unpadded stride 2, odd-size GEMMs
NEW_LAYERS: tuple[tuple[str, dict], ...] = (
    ("mbv2_pw_112_32to16_b1", dict(op="conv2d", N=1, H=112, W=112, C=32, K=16, R=1, S=1)),
    ("mbv2_pw_56_24to144_b8", dict(op="conv2d", N=8, H=56, W=56, C=24, K=144, R=1, S=1)),
    ("mbv2_pw_28_144to32_b8", dict(op="conv2d", N=8, H=28, W=28, C=144, K=32, R=1, S=1)),
    ("mbv2_pw_14_384to64_b8", dict(op="conv2d", N=8, H=14, W=14, C=384, K=64, R=1, S=1)),
    ("mbv2_pw_7_960to320_b1", dict(op="conv2d", N=1, H=7, W=7, C=960, K=320, R=1, S=1)),
    ("effb0_pw_28_240to40_b8", dict(op="conv2d", N=8, H=28, W=28, C=240, K=40, R=1, S=1)),
    ("effb0_pw_14_480to80_b8", dict(op="conv2d", N=8, H=14, W=14, C=480, K=80, R=1, S=1)),
    ("effb0_pw_14_672to112_b8", dict(op="conv2d", N=8, H=14, W=14, C=672, K=112, R=1, S=1)),
    ("effb0_pw_7_1152to320_b1", dict(op="conv2d", N=1, H=7, W=7, C=1152, K=320, R=1, S=1)),
    ("yolo_pw_52_256to128_b8", dict(op="conv2d", N=8, H=52, W=52, C=256, K=128, R=1, S=1)),
    ("yolo_26_256to512_b8", dict(op="conv2d", N=8, H=26, W=26, C=256, K=512, R=3, S=3, pad=1)),
    ("yolo_13_512to1024_b1", dict(op="conv2d", N=1, H=13, W=13, C=512, K=1024, R=3, S=3,
                                  pad=1)),
    ("yolo_76_128to256_s2_b4", dict(op="conv2d", N=4, H=76, W=76, C=128, K=256, R=3, S=3,
                                    stride=2, pad=1)),
    ("densenet_56_128to32_b8", dict(op="conv2d", N=8, H=56, W=56, C=128, K=32, R=3, S=3,
                                    pad=1)),
    ("densenet_pw_28_480to128_b8", dict(op="conv2d", N=8, H=28, W=28, C=480, K=128, R=1,
                                        S=1)),
    ("unet_128_64to64_b1", dict(op="conv2d", N=1, H=128, W=128, C=64, K=64, R=3, S=3, pad=1)),
    ("unet_64x96_128to128_b2", dict(op="conv2d", N=2, H=64, W=96, C=128, K=128, R=3, S=3,
                                    pad=1)),
    ("unet_40x24_256to256_b4", dict(op="conv2d", N=4, H=40, W=24, C=256, K=256, R=3, S=3,
                                    pad=1)),
    ("odd_28_100to200_b8", dict(op="conv2d", N=8, H=28, W=28, C=100, K=200, R=3, S=3, pad=1)),
    ("odd_pw_14_72to120_b16", dict(op="conv2d", N=16, H=14, W=14, C=72, K=120, R=1, S=1)),
    ("conv5x5_28_64to64_b8", dict(op="conv2d", N=8, H=28, W=28, C=64, K=64, R=5, S=5, pad=2)),
    ("unpadded_s2_56_64to128_b8", dict(op="conv2d", N=8, H=56, W=56, C=64, K=128, R=3, S=3,
                                       stride=2)),
    ("b1_7x7_512to512", dict(op="conv2d", N=1, H=7, W=7, C=512, K=512, R=3, S=3, pad=1)),
    ("gemm_classifier_256x1000x2048", dict(op="gemm", M=256, N=1000, K=2048)),
    ("gemv_1x4096x4096", dict(op="gemm", M=1, N=4096, K=4096)),
    ("gemm_16x1000x1280", dict(op="gemm", M=16, N=1000, K=1280)),
    ("gemm_odd_333x777x1000", dict(op="gemm", M=333, N=777, K=1000)),
    ("gemm_4096x4096x1000", dict(op="gemm", M=4096, N=4096, K=1000)),
)
#: templates measured in the GPU run (dispatch chooses among these)
GPU_TEMPLATES = ("triton.conv2d_int8", "triton.conv2d_int8_tma", "cuda.int8_wgmma",
                 "triton.gemm_int8", "triton.gemv_int8")
#: model seeds of each pruned-tuner replay (`pruned_rows`: the median is reported)
PRUNED_SEEDS = (0, 10, 20, 30, 40)
#: candidates `lowbit.tune.dispatch.choose_measured` times (the model's top ones) in the GPU run
TOP_K = 3
#: the bit-serial family templates (measured on the w1a2 layers; in the offline accuracy also
#: together, as BITSERIAL_GROUP: the one template "cuda.bitserial" they replaced)
BITSERIAL_TEMPLATES = tuple(f.name for f in FAMILIES)
BITSERIAL_GROUP = "cuda.bitserial_* (all families)"
BITSERIAL_LAYERS = ("resnet18_56x56_64to64_s1", "resnet18_14x14_256to256_s1",
                    "resnet50_s4_3x3_b256", "fc_b128_4096to4096", "mbv2_pw_14_384to64_b8",
                    "gemm_classifier_256x1000x2048", "b1_7x7_512to512")


def int8_layer(d_or_wl: dict | Workload) -> Workload:
    """The w8a8 layer: conv epilogue bias + ReLU -> s8 (what the next layer reads), GEMM
    int32 (the shared FC shapes' convention)."""
    from lowbit.core import workload_from_dict

    wl = d_or_wl if isinstance(d_or_wl, Workload) else workload_from_dict(d_or_wl)
    if isinstance(wl, ConvWorkload):
        return int8_workload(wl)
    return wl.replace(w="s8", a="s8", w_layout="int8", a_layout="int8", epilogue=Epilogue())


def bitserial_layer(wl: Workload) -> Workload:
    return wl.replace(w="b1", a="u2", w_layout="bitplane", a_layout="bitplane",
                      epilogue=BITPLANE_EPI)


def all_layers() -> list[tuple[str, Workload, bool]]:
    """(name, w8a8 workload, new shape?) for the shared workloads and NEW_LAYERS."""
    shared = [(n, int8_layer(wl), False) for s in SUITES for n, wl in load_workloads(s)]
    new = [(n, int8_layer(d), True) for n, d in NEW_LAYERS]
    out = []
    for i in range(max(len(shared), len(new))):  # interleaved: a cut budget keeps both kinds
        out += [x[i] for x in (shared, new) if i < len(x)]
    return out


def _doc(rows: list[dict], gpu: str, extra: dict) -> dict:
    import common

    return {"benchmark": "perfmodel", "gpu": gpu, "date": _dt.date.today().isoformat(),
            "versions": common.versions(), **extra, "rows": rows}


def _write(doc: dict, out: Path | None, gpu: str) -> Path:
    folder = out or ROOT / "benchmarks" / "results" / gpu.lower().replace(" ", "-")
    folder.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = folder / f"perfmodel-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


# ----------------------------------------------------------------------------- offline

def fp16_loo(ms: list[Measurement]) -> dict:
    """Accuracy of the fp16 estimate with each layer left out of its calibration."""
    fp = [m for m in ms if m.template == TORCH_FP16]
    pairs = []
    for layer in sorted({m.layer for m in fp}):
        params = cal.fit_params([m for m in fp if m.layer != layer], cal.FP16_PARAMS)
        for m in fp:
            if m.layer == layer:
                pairs.append((layer, m.gpu + layer,
                              cal.fp16_estimate_us(m.workload, m.gpu, params), m.events_us))
    row = accuracy(TORCH_FP16, pairs).row()
    return {**row, "kind": "model_accuracy", "model": "analytic_calibrated", "data": "recorded"}


def pruned_rows(ms: list[Measurement], min_space: int = 100, rounds: int | None = None,
                spaces: dict[tuple[str, str, str], dict] | None = None,
                fit: Callable | None = None, seeds: Sequence[int] = PRUNED_SEEDS
                ) -> list[dict]:
    """Pruned-tuner replay on each measured space of >= `min_space` verified configs (module
    doc): per (template, workload, gpu) group a row {template, workload (its key), gpu,
    space_size (verified configs replayed), survivors, trials_to_097,
    fraction_measured_to_097 (of space_size), random_fraction_to_097, exhaustive,
    space_note}. `spaces`: `dataset.table_spaces` of the results (a group an exhaustive
    tables file measured is "exhaustive": true, with that table's layer name, its
    template_space_size and space_failed: configs that failed, left out of the replay);
    `fit`: the model fit (`evaluate.Fit`; default `learned_fit`), trained without the layer;
    without `fit`, one replay per model seed of `seeds` (the default model, `MEMBERS`
    boosters on seeds seed, seed + 1, ...: the trees' subsampling moves a model's ranking;
    one booster's fraction on the exhaustive 1,000+ spaces ranged 0.03-0.19 over seeds),
    trials_to_097 their median (a replay that never reaches 0.97x counts as the whole space)
    and fraction_by_seed each one's fraction."""
    from lowbit.tune.replay import expected_random_trials, replay, table_space
    from lowbit.tune.strategies import PrunedSearch

    ms = [m for m in ms if m.template != TORCH_FP16]
    extra = {"rounds": rounds} if rounds else {}
    fits = [fit] if fit is not None else [learned_fit(seed=s, **extra) for s in seeds]
    spaces = spaces or {}
    layer_of = np.array([m.layer for m in ms])
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, m in enumerate(ms):
        groups[(m.template, m.workload.key, m.gpu)].append(i)
    rows = []
    for (tmpl, key, gpu), ix in sorted(groups.items()):
        if len(ix) < min_space:
            continue
        train = np.flatnonzero(layer_of != ms[ix[0]].layer)
        cfgs = [ms[i].config for i in ix]
        times = {ms[i].config: ms[i].events_us for i in ix}
        target = min(times.values()) / 0.97
        good = sum(t <= target for t in times.values())
        trials = []
        for f in fits:
            by_cfg = dict(zip(cfgs, f(ms, train)(np.array(ix)), strict=True))
            strat = PrunedSearch(table_space(cfgs), ms[ix[0]].workload, tmpl,
                                 predict=lambda cs, p=by_cfg: [p[c] for c in cs], gpu=gpu)
            trials.append(replay(strat, times, target, batch=8))
        n = int(statistics.median(len(ix) if t is None else t for t in trials))
        row = {"kind": "pruned_tuner", "template": tmpl, "workload": key, "gpu": gpu,
               "space_size": len(ix), "survivors": strat.survivors,
               "trials_to_097": n, "model_seeds": len(fits),
               "fraction_by_seed": [None if t is None else round(t / len(ix), 4)
                                    for t in trials],
               "fraction_measured_to_097": round(n / len(ix), 4),
               "random_fraction_to_097": round(
                   expected_random_trials(len(ix), good) / len(ix), 4),
               "exhaustive": False,
               "space_note": "table of measured configs (exhaustive for the "
                             "triton.conv2d_int8 tables, the configs ever measured "
                             "for the others)"}
        table = spaces.get((gpu, tmpl, key))
        if table is not None and table["exhaustive"]:
            row.update(exhaustive=True, layer=table["layer"],
                       template_space_size=table["space_size"],
                       space_failed=table["failed"],
                       space_note=f"exhaustive table ({table['source']}): every config of "
                                  f"the space built, verified and timed; the "
                                  f"{table['failed']} that failed are left out of the replay")
        rows.append(row)
    return rows


def held_out_layers(ms: list[Measurement], quick: bool, templates: list[str] | None,
                    max_layers: int | None) -> list[str] | None:
    """The layers the offline evaluation holds out (None: every layer): --quick keeps layers
    of >= 100 rows, --templates those with a row of these templates, --max-layers an evenly
    spaced sample of that many (sorted by name, so reruns hold out the same ones)."""
    if not (quick or templates or max_layers):
        return None
    counts: dict[str, int] = defaultdict(int)
    for m in ms:
        if m.template != TORCH_FP16 and (not templates or m.template in templates):
            counts[m.layer] += 1
    layers = sorted(k for k, v in counts.items() if v >= (100 if quick else 1))
    if max_layers and len(layers) > max_layers:
        layers = [layers[i * len(layers) // max_layers] for i in range(max_layers)]
    return layers


def offline(results: Path, quick: bool, out: Path | None, templates: list[str] | None = None,
            max_layers: int | None = None, pruned: bool = True, min_space: int = 100,
            accuracy_rows: bool = True) -> list[dict]:
    """The offline evaluation (module doc); `templates` / `max_layers`: a quicker partial run
    while iterating (`held_out_layers`; the default run holds out every layer); min_space:
    the pruned tuner's smallest space (verified configs); accuracy_rows False: the pruned
    tuner's replays only."""
    t0 = time.perf_counter()
    ms = deduplicate(load_results(results))
    print(f"{len(ms)} measurements after deduplication ({time.perf_counter() - t0:.0f} s)",
          flush=True)
    for (gpu, tmpl), (layers, n) in summary(ms).items():
        print(f"  {gpu:24s} {tmpl:26s} {layers:3d} layers {n:5d} rows")
    rounds = 150 if quick else None  # None: the shipped model's (LearnedModel's default)
    rows: list[dict] = []
    layers = held_out_layers(ms, quick, templates, max_layers)
    learned = memoized(learned_fit(rounds=rounds) if rounds else learned_fit())
    fits = (("learned", learned, False), ("learned_anchored", learned, True),
            ("analytic", _analytic_fit, False)) if accuracy_rows else ()
    for name, fit, anchor in fits:
        t1 = time.perf_counter()
        for acc in leave_one_layer_out(ms, fit, templates=templates, layers=layers,
                                       groups={BITSERIAL_GROUP: BITSERIAL_TEMPLATES},
                                       anchor=anchor):
            rows.append({**acc.row(), "kind": "model_accuracy", "model": name,
                         "data": "recorded"})
        print(f"leave-one-layer-out ({name}): {time.perf_counter() - t1:.0f} s", flush=True)
    if accuracy_rows and (not templates or TORCH_FP16 in templates):
        rows.append(fp16_loo(ms))
    if pruned:
        from lowbit.perfmodel.dataset import table_spaces

        t1 = time.perf_counter()
        rows += pruned_rows(ms, min_space, rounds=rounds, spaces=table_spaces(results))
        print(f"pruned-tuner replays: {time.perf_counter() - t1:.0f} s", flush=True)
    gpu = H100_NAME  # the results folder; the label names every GPU the data came from
    measured_on = " and ".join(sorted({m.gpu for m in ms}))
    doc = _doc(rows, f"offline: recorded measurements on {measured_on}",
               {"mode": "offline" if accuracy_rows else "offline, pruned tuner only",
                "min_space": min_space, "measurements": len(ms),
                "sources": [*sorted({m.source for m in ms})[:3], "..."]})
    print(f"wrote {_write(doc, out, gpu)}")
    return rows


def _analytic_fit(ms: list[Measurement], train: np.ndarray):
    """The analytic model alone, with its default constants (`AnalyticParams`: five numbers
    fitted once on all recorded layers, so not strictly held out)."""
    from lowbit.core.hardware import gpu_spec_for
    from lowbit.perfmodel.analytic import estimate
    from lowbit.perfmodel.geometry import geometry

    def predict(test: np.ndarray) -> np.ndarray:
        return np.array([estimate(geometry(ms[i].template, ms[i].workload, ms[i].config),
                                  ms[i].workload, gpu_spec_for(ms[i].gpu)).total_us
                         for i in test])

    return predict


# ----------------------------------------------------------------------------- GPU

class GpuRun:
    """State of the device run: measurer, model, rows, budget."""

    def __init__(self, budget_s: float, measurer=None, fp16_us=None) -> None:
        from lowbit.core.hardware import current_gpu_spec
        from lowbit.kernels import load_backends
        from lowbit.perfmodel.predict import default_model
        from lowbit.tune import LocalMeasurer

        load_backends()
        self.t0 = time.perf_counter()
        self.budget_s = budget_s
        self.spec = current_gpu_spec()
        self.model = default_model()
        print(f"model ready in {time.perf_counter() - self.t0:.0f} s", flush=True)
        self.measurer = measurer or LocalMeasurer(device="cuda", timeout_s=30,
                                                  compile_timeout_s=120, warmup_ms=10,
                                                  rep_ms=40)
        self.fp16_us = fp16_us or _fp16_us
        from lowbit.perfmodel.dataset import load_snapshot

        # layers the default model trained on: accuracy on the others is held out
        self.trained = {m.layer for m in load_snapshot()}
        self.rows: list[dict] = []
        self.rng = random.Random(0)
        #: per layer, the (template, config)s `choose_measured` would time
        self.top: dict[str, list[tuple[str, Config]]] = {}

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)

    def plan(self, name: str, wl: Workload, templates: tuple[str, ...]) -> list[tuple]:
        """(template, config, role, pick) candidates of one layer: the dispatch pick, each
        template's default and its model-ranked best candidate, and one random candidate of
        the dispatch pick's template. The bit-serial families count as one template (as
        `choose` ranks them): `default_bitserial`'s kernel is their default, their model pick
        the best of all their candidates."""
        from lowbit.kernels import get_template
        from lowbit.tune.dispatch import (
            candidate_configs,
            choose,
            group_default,
            ranked_candidates,
            template_groups,
        )

        usable = [get_template(t) for t in templates]
        usable = [t for t in usable if _supports(t, wl)]
        jobs: dict[tuple[str, Config], str] = {}
        pick = choose(wl, self.spec, templates=usable, include_fp16=False)
        jobs[(pick.template, pick.config)] = "dispatch"
        # `choose_measured`'s candidates: the model's top TOP_K of the same pool
        self.top[name] = [(c.template, c.config)
                          for c in ranked_candidates(wl, self.spec, usable, TOP_K)]
        for tc in self.top[name]:
            jobs.setdefault(tc, "top")
        for group in template_groups(usable):
            cands: list[tuple[str, Config]] = []
            for t in group:
                try:
                    cands += [(t.name, c) for c in
                              candidate_configs(t, wl, 48, seed=self.rng.randrange(1000))]
                except Exception as e:
                    print(f"  {name} {t.name}: no candidates ({type(e).__name__}: {e})"[:200])
            if not cands:
                continue
            default_t, default = group_default(group, wl)
            pred = self.model.predict([(t, wl, c) for t, c in cands], self.spec)
            jobs.setdefault((default_t.name, default), "default")
            for i in [int(i) for i in np.argsort(pred)][:2]:
                if cands[i] != (default_t.name, default):
                    jobs.setdefault(cands[i], "model")
                    break
            mine = [tc for tc in cands if tc[0] == pick.template]
            if len(mine) > 3:
                jobs.setdefault(mine[self.rng.randrange(1, len(mine))], "random")
        return [(t, c, role, pick) for (t, c), role in jobs.items()]

    def measure_layer(self, name: str, wl: Workload, new: bool,
                      templates: tuple[str, ...]) -> None:
        from lowbit.kernels import get_template
        from lowbit.tune import MeasureInput

        t_choose = time.perf_counter()
        jobs = self.plan(name, wl, templates)
        choose_s = time.perf_counter() - t_choose  # the plan: choose + candidates + ranking
        if not jobs:
            return
        held_out = wl.key.split("|", 1)[0] not in self.trained
        pick = jobs[0][3]
        inputs = [MeasureInput(get_template(t), wl, c) for t, c, _, _ in jobs]
        results = self.measurer.measure(inputs)
        measured = {}
        for (t, c, role, _), res in zip(jobs, results, strict=True):
            pred = float(self.model.predict([(t, wl, c)], self.spec)[0])
            self.rows.append({"kind": "measurement", "workload": name, "new_shape": new,
                              "held_out": held_out,
                              "workload_key": wl.key, "wl": wl.to_dict(), "template": t,
                              "config": dict(c), "role": role, "time_us": res.time_us,
                              "predicted_us": round(pred, 3), "error": res.error})
            if res.time_us is not None:
                measured[(t, c)] = res.time_us
        fp16 = self.fp16_us(wl)
        ok = sorted(measured.items(), key=lambda kv: kv[1])
        dispatch_us = measured.get((pick.template, pick.config))
        tuned_us = ok[0][1] if ok else None
        top = [measured[tc] for tc in self.top.get(name, []) if tc in measured]
        top_us = min(top) if top else None
        engine = _engine_choice(pick, fp16, self.spec, wl)
        engine_us = fp16 if engine == TORCH_FP16 else dispatch_us
        self.rows.append({
            "kind": "dispatch", "workload": name, "new_shape": new, "workload_key": wl.key,
            "template": pick.template, "config": dict(pick.config),
            "predicted_us": round(pick.predicted_us, 3), "dispatch_us": dispatch_us,
            "tuned_us": tuned_us, "tuned_template": ok[0][0][0] if ok else None,
            "dispatch_over_tuned": None if dispatch_us is None or tuned_us is None
            else round(dispatch_us / tuned_us, 3), "dispatch_failed": dispatch_us is None,
            f"measured_top{TOP_K}_us": top_us,
            f"measured_top{TOP_K}_over_tuned": None if top_us is None or tuned_us is None
            else round(top_us / tuned_us, 3),
            "cudnn_fp16_us": fp16, "wl_fp16": int8_workload(wl).to_dict(),
            "engine_template": engine, "engine_us": engine_us,
            "engine_over_fp16": None if engine_us is None or fp16 is None
            else round(engine_us / fp16, 3),
            "n_measured": len(measured), "n_failed": len(jobs) - len(measured),
            "held_out": held_out, "plan_s": round(choose_s, 3)})
        r = self.rows[-1]
        print(f"{name:32s} {pick.template:24s} dispatch {_f(dispatch_us)} tuned "
              f"{_f(tuned_us)} fp16 {_f(fp16)} engine {engine} "
              f"({len(measured)}/{len(jobs)} ok, {self.left():.0f} s left)", flush=True)
        del r

    def sampling(self, limit: int = 4) -> None:
        """Saturation-point sampling vs measurement for a few large layers' defaults."""
        from lowbit.kernels import get_template
        from lowbit.perfmodel.sampling import sampling_predict, waves
        from lowbit.tune import MeasureInput

        done = 0
        for r in [r for r in self.rows if r["kind"] == "measurement" and r["role"] == "default"
                  and r["time_us"] is not None]:
            if done >= limit or self.left() < 20:
                break
            from lowbit.core import workload_from_dict

            wl, t, c = workload_from_dict(r["wl"]), get_template(r["template"]), \
                Config(r["config"])
            if waves(t, wl, c, self.spec) < 5:
                continue

            def measure(w: Workload, t=t, c=c) -> float:
                res = self.measurer.measure([MeasureInput(t, w, c)])[0]
                if res.time_us is None:
                    raise RuntimeError(res.error)
                return res.time_us

            try:
                p = sampling_predict(measure, t, wl, c, self.spec)
            except Exception as e:
                print(f"  sampling {r['workload']} {t.name}: {type(e).__name__}: {e}"[:200])
                continue
            done += 1
            self.rows.append({"kind": "sampling", "workload": r["workload"],
                              "template": t.name, "config": r["config"],
                              "target_waves": p.target_waves, "samples": p.samples,
                              "predicted_us": round(p.predicted_us, 3),
                              "measured_us": r["time_us"],
                              "ape": round(abs(p.predicted_us - r["time_us"])
                                           / r["time_us"] * 100, 2)})

    def accuracy_rows(self) -> None:
        for held_only in (True, False):
            pairs: dict[str, list] = defaultdict(list)
            for r in self.rows:
                if r["kind"] == "measurement" and r["time_us"] and (r["held_out"] or
                                                                    not held_only):
                    pairs[r["template"]].append((r["workload"], r["workload_key"],
                                                 r["predicted_us"], r["time_us"]))
            for tmpl, p in sorted(pairs.items()):
                self.rows.append({**accuracy(tmpl, p, min_tau_configs=4).row(),
                                  "kind": "model_accuracy", "model": "learned",
                                  "data": "fresh, held-out layers" if held_only
                                  else "fresh, all layers"})


def _supports(t, wl: Workload) -> bool:
    try:
        return t.supports(wl)
    except Exception:
        return False


def _fp16_us(wl: Workload) -> float | None:
    import common

    try:
        if isinstance(wl, GemmWorkload):
            return common.fp16_gemm_us(wl)
        return common.cudnn_fp16_conv_us(wl)
    except Exception as e:
        print(f"  fp16 baseline failed: {type(e).__name__}: {e}"[:200])
        return None


def _engine_choice(pick, fp16_measured: float | None, spec, wl: Workload) -> str:
    """The engine's choice by prediction (fp16 estimate vs our pick), as `choose` makes it."""
    fp16_pred = cal.fp16_estimate_us(wl, spec)
    return TORCH_FP16 if fp16_pred < pick.predicted_us else pick.template


def _f(v: float | None) -> str:
    return "   -   " if v is None else f"{v:7.1f}"


def gpu_mode(budget_s: float, out: Path | None, bitserial: bool, run: GpuRun | None = None
             ) -> list[dict]:
    import torch

    if run is None:
        if not torch.cuda.is_available():
            sys.exit("--gpu needs a CUDA GPU")
        run = GpuRun(budget_s)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (dry run)"
    layers = all_layers()
    plan = [(n, wl, new, GPU_TEMPLATES) for n, wl, new in layers]
    if bitserial:  # every eighth entry a w1a2 layer, so a cut budget keeps some of each
        by_name = {n: (wl, new) for n, wl, new in layers}
        bits = [(n + "_w1a2", bitserial_layer(by_name[n][0]), by_name[n][1],
                 BITSERIAL_TEMPLATES) for n in BITSERIAL_LAYERS if n in by_name]
        for i, entry in enumerate(bits):
            plan.insert(min(len(plan), 4 + 8 * i), entry)
    try:
        for name, wl, new, templates in plan:
            if run.left() < 25:
                print(f"budget spent: skipping {name} and later layers")
                break
            try:
                run.measure_layer(name, wl, new, templates)
            except Exception as e:
                traceback.print_exc()
                run.rows.append({"kind": "error", "workload": name, "error": repr(e)[:300]})
        run.sampling()
    finally:
        run.measurer.close()
    run.accuracy_rows()
    doc = _doc(run.rows, gpu, {"mode": "gpu", "budget_s": budget_s,
                               "wall_s": round(time.perf_counter() - run.t0, 1)})
    print(f"wrote {_write(doc, out, gpu)}")
    return run.rows


# ----------------------------------------------------------------------------- table

def print_table(rows: list[dict]) -> None:
    acc = [r for r in rows if r["kind"] == "model_accuracy"]
    if acc:
        print(f"\n{'model accuracy':56s} {'MdAPE%':>7s} {'tau':>6s} {'layers':>6s} "
              f"{'configs':>7s}")
        for r in acc:
            tau = "   -  " if r["kendall_tau"] is None else f"{r['kendall_tau']:6.3f}"
            label = f"{r['template']} [{r['model'][:8]}, {r['data'][:20]}]"
            print(f"{label:56s} {r['median_ape']:7.1f} {tau} {r['n_layers']:6d} "
                  f"{r['n_configs']:7d}")
    pruned = [r for r in rows if r["kind"] == "pruned_tuner"]
    if pruned:
        fr = [r["fraction_measured_to_097"] for r in pruned
              if r["fraction_measured_to_097"] is not None]
        rnd = [r["random_fraction_to_097"] for r in pruned]
        print(f"\npruned tuner: {len(pruned)} spaces, median fraction to 0.97x "
              f"{statistics.median(fr) if fr else float('nan'):.3f} (random "
              f"{statistics.median(rnd):.3f}); <= 10% on "
              f"{sum(f <= 0.10 for f in fr)} of {len(pruned)}")
        for r in pruned:
            if r.get("exhaustive") and r["space_size"] >= 1000:
                print(f"  exhaustive {r['template']} {r.get('layer') or r['workload'][:40]}: "
                      f"{r['space_size']} configs ({r.get('space_failed')} failed), fraction "
                      f"to 0.97x {r['fraction_measured_to_097']} (random "
                      f"{r['random_fraction_to_097']})")
    disp = [r for r in rows if r["kind"] == "dispatch"]
    if disp:
        ratios = [r["dispatch_over_tuned"] for r in disp if r["dispatch_over_tuned"]]
        print(f"\ndispatch: {len(disp)} layers, median dispatch/tuned "
              f"{statistics.median(ratios) if ratios else float('nan'):.3f}, within 1.25x "
              f"on {sum(x <= 1.25 for x in ratios)} of {len(ratios)}; plan (choose + candidates) "
              f"median {statistics.median(r['plan_s'] for r in disp):.2f} s on the host CPU")
        top = [r.get(f"measured_top{TOP_K}_over_tuned") for r in disp]
        top = [x for x in top if x]
        if top:
            print(f"measured top {TOP_K}: median / tuned {statistics.median(top):.3f}, within "
                  f"1.25x on {sum(x <= 1.25 for x in top)} of {len(top)}")
    samp = [r for r in rows if r["kind"] == "sampling"]
    if samp:
        print(f"sampling: {len(samp)} configs, median APE "
              f"{statistics.median(r['ape'] for r in samp):.1f}%")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpu", action="store_true", help="measure on this GPU (module doc)")
    ap.add_argument("--budget-s", type=float, default=230.0,
                    help="GPU mode: seconds for measuring (the run ends about 30 s later)")
    ap.add_argument("--no-bitserial", action="store_true")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--quick", action="store_true", help="offline: layers of >= 100 rows")
    ap.add_argument("--templates", nargs="+", default=None,
                    help="offline: report only these templates (held out: their layers)")
    ap.add_argument("--max-layers", type=int, default=None,
                    help="offline: hold out an evenly spaced sample of this many layers")
    ap.add_argument("--no-pruned", action="store_true",
                    help="offline: skip the pruned-tuner replays")
    ap.add_argument("--pruned-only", action="store_true",
                    help="offline: the pruned-tuner replays only (no model accuracy rows)")
    ap.add_argument("--min-space", type=int, default=100,
                    help="offline: pruned tuner on spaces of at least this many verified "
                         "configs (1000: the exhaustive 1,000+ config tables)")
    ap.add_argument("--export-snapshot", action="store_true",
                    help=f"offline: rewrite {SNAPSHOT.name} from --results")
    ap.add_argument("--calibrate", action="store_true", help="offline: print fitted constants")
    ap.add_argument("--out", type=Path, default=None, help="results folder")
    args = ap.parse_args(argv)
    if args.out is None and os.environ.get("OUT"):
        args.out = Path(os.environ["OUT"])
    if args.gpu:
        rows = gpu_mode(args.budget_s, args.out, not args.no_bitserial)
    elif args.export_snapshot or args.calibrate:
        ms = deduplicate(load_results(args.results))
        if args.export_snapshot:
            print(f"wrote {save_snapshot(ms)} measurements to {SNAPSHOT}")
        if args.calibrate:
            ours = [m for m in ms if m.template != TORCH_FP16]
            fp = [m for m in ms if m.template == TORCH_FP16]
            print("ours:", cal.fit_params(ours[:: max(1, len(ours) // 2000)]))
            print("fp16:", cal.fit_params(fp, cal.FP16_PARAMS))
        return
    else:
        rows = offline(args.results, args.quick, args.out, args.templates, args.max_layers,
                       not args.no_pruned, args.min_space, not args.pruned_only)
    print_table(rows)


if __name__ == "__main__":
    main()
