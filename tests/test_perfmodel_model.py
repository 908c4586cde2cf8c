"""Geometry per family, the analytic estimate, features, the learned model, evaluation and
calibration: on hand-computed cases and synthetic data (fast, no GPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lowbit.core import Config, ConvWorkload, Epilogue, GemmWorkload
from lowbit.kernels.base import TORCH_FP16
from lowbit.kernels.cuda import FAMILIES, INT8_WGMMA, LEGACY, MMA_SYNC, TAP_SHIFT, WGMMA_PERSISTENT
from lowbit.perfmodel import H100, estimate, geometry
from lowbit.perfmodel.analytic import DEFAULT_PARAMS
from lowbit.perfmodel.dataset import Measurement
from lowbit.perfmodel.evaluate import (
    accuracy,
    anchored_predictions,
    kendall_tau,
    leave_one_layer_out,
    memoized,
)
from lowbit.perfmodel.features import GENERIC, Featurizer
from lowbit.perfmodel.fit import FP16_PARAMS, fit_params, fp16_estimate_us, median_ape
from lowbit.perfmodel.learned import LearnedModel

CONV = ConvWorkload(N=16, H=14, W=14, C=256, K=256, R=3, S=3, pad=1, w="s8", a="s8",
                    epilogue=Epilogue(bias=True, relu=True, out="s8"))
BITS = CONV.replace(w="b1", a="u2", w_layout="bitplane", a_layout="bitplane",
                    epilogue=Epilogue(bias=True, relu=True, out="u2", out_layout="bitplane"))
IGEMM = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3,
         "GROUP_M": 8, "LOOP_ORDER": "rsc", "SPLIT_K": 1}


def test_geometry_of_each_family():
    m = 16 * 14 * 14  # 3136 output pixels
    g = geometry("triton.conv2d_int8", CONV, IGEMM)
    assert (g.family, g.rate, g.M, g.N, g.K) == ("igemm", "int8", m, 256, 9 * 256)
    assert (g.tiles, g.k_steps, g.threads) == (math.ceil(m / 128) * 4, 9 * 4, 128)
    assert g.smem_bytes == 3 * (128 + 64) * 64
    tma = geometry("triton.conv2d_int8_tma", CONV, {**IGEMM, "BLOCK_I": 2, "BLOCK_P": 4,
                                                    "BLOCK_Q": 8})
    assert tma.family == "tma_conv" and tma.block_m == 64
    assert tma.padded_m == 8 * 4 * 2 * 64  # 8 x 4 x 2 pixel tiles over 16 x 14 x 14
    legacy = {"BM": 128, "BN": 64, "WM": 64, "WN": 64, "KT": 1, "STAGES": 3, "MMA": "wgmma",
              "PERSIST": 1, "TEAMS": 2}  # a "cuda.bitserial" record of before the split
    bits = geometry(LEGACY, BITS, legacy)
    assert (bits.family, bits.rate, bits.planes) == ("bitserial", "b1_and", 2)
    assert bits.k_steps == 9 and bits.threads == 2 * 128 * 2 and bits.persistent
    family = {k: v for k, v in legacy.items() if k in WGMMA_PERSISTENT.knobs.names}
    family = Config({**WGMMA_PERSISTENT.knobs.neutral(), **family})
    assert geometry(WGMMA_PERSISTENT, BITS, family) == bits  # its fixed WM, MMA, PERSIST
    sync = geometry(MMA_SYNC.name, BITS, {**MMA_SYNC.knobs.neutral(), "BM": 64, "BN": 64,
                                          "WM": 32, "WN": 32, "KT": 2, "STAGES": 3})
    assert (sync.family, sync.threads, sync.persistent) == ("bitserial", 4 * 32, False)
    shift = geometry(TAP_SHIFT.name, BITS, TAP_SHIFT.default_config(BITS, "sm_90a"))
    assert shift.family == "bitserial" and shift.k_step == 256  # KT fixed to 1
    s8 = geometry(INT8_WGMMA.name, CONV, INT8_WGMMA.default_config(CONV, "sm_90a"))
    assert (s8.family, s8.rate) == ("bitserial", "int8")
    mma = geometry("cuda.mma_conv_s8", CONV, {"warps_m": 2, "warps_n": 2, "tiles_m": 2,
                                              "tiles_n": 4, "k_chunk": 64})
    assert (mma.family, mma.block_m, mma.block_n, mma.threads) == ("mma_conv", 64, 128, 128)
    gen = geometry("other", GemmWorkload(M=100, N=60, K=64), {"BM": 32, "BN": 16})
    assert (gen.family, gen.block_m, gen.block_n) == ("generic", 32, 16)
    assert geometry(TORCH_FP16, CONV, {}).rate == "fp16"


def test_estimate_grows_with_waves_and_refuses_unlaunchable_blocks():
    times = [estimate(geometry("triton.conv2d_int8", CONV.replace(N=n), IGEMM),
                      CONV.replace(N=n)).total_us for n in (16, 64, 256)]
    assert times[0] < times[1] < times[2]
    e = estimate(geometry("triton.conv2d_int8", CONV, IGEMM), CONV)
    assert e.full_waves == math.ceil(e.waves) and e.total_us > DEFAULT_PARAMS.overhead_us
    huge = {**IGEMM, "BLOCK_M": 256, "BLOCK_N": 256, "BLOCK_K": 256, "num_stages": 4}
    assert estimate(geometry("triton.conv2d_int8", CONV, huge), CONV).total_us == math.inf


def test_featurizer_columns_and_unknown_values():
    legacy = dict(TAP_SHIFT.spec(TAP_SHIFT.default_config(BITS, "sm_90a")))  # pre-split form
    f = Featurizer().fit([("triton.conv2d_int8", CONV, IGEMM), ("cuda.bitserial", BITS, legacy)])
    assert f.names[: len(GENERIC)] == list(GENERIC)
    assert "igemm:LOOP_ORDER" in f.names and "bitserial:MMA" in f.names
    x, est = f.matrix([("triton.conv2d_int8", CONV, {**IGEMM, "LOOP_ORDER": "crs"})], H100)
    col = f.names.index("igemm:LOOP_ORDER")
    assert x.shape == (1, len(f.names)) and est[0] > 0
    assert math.isnan(x[0, col])  # a value the fit never saw is missing, not a wrong code
    assert math.isnan(x[0, f.names.index("bitserial:MMA")])
    assert Featurizer.from_dict(f.to_dict()).names == f.names


def test_family_configs_and_their_legacy_records_share_feature_rows():
    """A family config is read as its kernel's full parameters: the same row as the legacy
    "cuda.bitserial" record of that kernel, MMA / PERSIST / TAP_SHIFT among the columns."""
    points = []
    for family in FAMILIES:
        cfg = family.default_config(BITS, "sm_90a")
        points += [(family.name, BITS, cfg), (LEGACY, BITS, dict(family.spec(cfg)))]
    f = Featurizer().fit(points)
    assert {"bitserial:MMA", "bitserial:PERSIST", "bitserial:TAP_SHIFT"} <= set(f.names)
    x, est = f.matrix(points, H100)
    checked = 0
    for i in range(0, len(points), 2):
        assert np.array_equal(x[i], x[i + 1], equal_nan=True) and est[i] == est[i + 1]
        checked += 1
    assert checked == len(FAMILIES) == 5
    kinds = {tuple(row) for row in x[:, [f.names.index(f"bitserial:{k}") for k in
                                          ("MMA", "PERSIST", "TAP_SHIFT")]]}
    assert len(kinds) >= 4  # the families' kernels are told apart


def _synthetic(n_layers: int = 6) -> list[Measurement]:
    """Times with a known dependence on the knobs and the layer size (learnable)."""
    out = []
    for i in range(n_layers):
        wl = CONV.replace(N=8 * (i + 1))
        for bm in (64, 128, 256):
            for stages in (2, 3, 4):
                cfg = Config({**IGEMM, "BLOCK_M": bm, "num_stages": stages})
                t = 10.0 + 0.02 * wl.N * (1.0 + (bm == 256)) * (1.3 if stages == 2 else 1.0)
                out.append(Measurement("G", "triton.conv2d_int8", wl, cfg, t, "events", "s",
                                       "x"))
    return out


def test_learned_model_fits_and_round_trips(tmp_path):
    ms = _synthetic()
    model = LearnedModel(rounds=60, threads=1).fit(ms)
    pts = [(m.template, m.workload, m.config) for m in ms]
    pred = model.predict(pts, H100)
    ape = np.abs(pred - [m.time_us for m in ms]) / [m.time_us for m in ms]
    assert float(np.median(ape)) < 0.05
    model.save(tmp_path / "m.json")
    again = LearnedModel.load(tmp_path / "m.json")
    assert np.allclose(again.predict(pts, H100), pred)
    assert np.allclose(LearnedModel().predict(pts[:2], H100),  # untrained: analytic only
                       [estimate(geometry(p[0], p[1], p[2]), p[1]).total_us for p in pts[:2]])
    with pytest.raises(ValueError, match="at least one"):
        LearnedModel().fit([])


def test_members_average_in_log_space_and_survive_save_load(tmp_path):
    """members=3: three boosters on seeds 5, 6, 7, the prediction the geometric mean of
    theirs; saved and loaded with all three; a file of one booster (before members) loads."""
    import json

    ms = _synthetic()
    pts = [(m.template, m.workload, m.config) for m in ms]
    trio = LearnedModel(rounds=40, seed=5, members=3).fit(ms)
    singles = [LearnedModel(rounds=40, seed=s, members=1).fit(ms).predict(pts, H100)
               for s in (5, 6, 7)]
    assert not np.allclose(singles[0], singles[1])  # the seeds differ
    assert np.allclose(trio.predict(pts, H100), np.exp(np.mean(np.log(singles), axis=0)))
    trio.save(tmp_path / "m.json")
    again = LearnedModel.load(tmp_path / "m.json")
    assert again.members == 3 and np.allclose(again.predict(pts, H100), trio.predict(pts, H100))
    one = LearnedModel(rounds=40, seed=5, members=1).fit(ms)
    one.save(tmp_path / "one.json")
    doc = json.loads((tmp_path / "one.json").read_text())
    doc["booster"] = doc.pop("boosters")[0]
    del doc["members"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert np.allclose(LearnedModel.load(tmp_path / "old.json").predict(pts, H100), singles[0])
    with pytest.raises(ValueError, match="members must be >= 1"):
        LearnedModel(members=0)


def test_learned_model_fits_the_median_time_through_slow_outliers():
    """Each point measured three times, one of them 4x slow on half the points: the default
    objective (absolute error of the log ratio) predicts the typical time, squared error is
    pulled toward the outliers."""
    ms = _synthetic()
    rows = [Measurement(m.gpu, m.template, m.workload, m.config,
                        m.time_us * (4.0 if k == 0 and i % 2 == 0 else 1.0), "events", "s",
                        str(k))
            for k in range(3) for i, m in enumerate(ms)]
    pts = [(m.template, m.workload, m.config) for m in ms]
    truth = np.array([m.time_us for m in ms])

    def ape(**kw: object) -> float:
        pred = LearnedModel(rounds=60, **kw).fit(rows).predict(pts, H100)
        return float(np.median(np.abs(pred - truth) / truth))

    assert LearnedModel().params["objective"] == "reg:absoluteerror"
    assert ape() < 0.03
    assert ape(objective="reg:squarederror") > 0.10


def test_kendall_tau_and_accuracy():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([4, 3, 2, 1], [10, 20, 30, 40]) == pytest.approx(-1.0)
    pairs = [("L", "w", 11.0, 10.0), ("L", "w", 18.0, 20.0), ("M", "v", 5.0, 5.0)]
    acc = accuracy("t", pairs, min_tau_configs=2)
    assert acc.median_ape == pytest.approx(10.0)
    assert acc.kendall_tau == pytest.approx(1.0) and acc.n_tau_layers == 1
    assert (acc.n_layers, acc.n_configs) == (2, 3)


def test_leave_one_layer_out_holds_each_layer_out():
    ms = _synthetic(4)
    seen_train: list[set[str]] = []

    def oracle(all_ms, train):  # exact times; records what each fold trained on
        seen_train.append({all_ms[i].layer for i in train})
        return lambda test: np.array([all_ms[i].time_us for i in test])

    (acc,) = leave_one_layer_out(ms, oracle)
    layers = {m.layer for m in ms}
    assert len(seen_train) == len(layers) == 4
    assert all(len(s) == 3 for s in seen_train)  # the held-out layer never trains
    assert acc.median_ape == 0.0 and acc.kendall_tau == pytest.approx(1.0)
    assert (acc.n_layers, acc.n_configs) == (4, len(ms))
    halves = [Measurement(m.gpu, "ab"[i % 2], m.workload, m.config, m.time_us, m.timing,
                          m.source, m.stamp) for i, m in enumerate(ms)]
    a, b, both = leave_one_layer_out(halves, oracle, groups={"a+b": ("a", "b")})
    assert [x.template for x in (a, b, both)] == ["a", "b", "a+b"]
    assert both.n_configs == a.n_configs + b.n_configs == len(ms)
    assert both.n_tau_layers == 4  # each workload's configs of both templates ranked together


def _oracle(scale: float = 1.0, seen: list | None = None):
    """A `Fit` predicting `scale` x the measured time; records each fold's training rows."""
    def fit(all_ms, train):
        if seen is not None:
            seen.append([all_ms[i] for i in train])
        return lambda test: np.array([scale * all_ms[i].events_us for i in test])
    return fit


def test_leave_one_layer_out_holds_out_every_gpu_and_precision_of_a_layer():
    """A layer measured on two GPUs, at two precisions and by two templates is one fold: none
    of its rows trains the model that predicts any of them."""
    rows = []
    for i, wl in enumerate((CONV, CONV.replace(N=32), CONV.replace(C=128))):
        for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
            for tmpl, w in (("triton.conv2d_int8", wl), ("cuda.bitserial_wgmma",
                                                         wl.replace(w="b1", a="u2"))):
                rows.append(Measurement(gpu, tmpl, w, Config(IGEMM), 10.0 + i, "events"))
    seen: list[list[Measurement]] = []
    out = leave_one_layer_out(rows, _oracle(seen=seen))
    assert len(seen) == 3 and sum(a.n_configs for a in out) == len(rows) == 12
    layers = sorted({m.layer for m in rows})
    for layer, train in zip(layers, seen, strict=True):  # folds in layer order
        assert len(train) == 8 and all(m.layer != layer for m in train)
    assert all(a.median_ape == 0.0 and a.n_layers == 3 for a in out)


def test_anchored_predictions_scale_each_workload_by_its_fastest_predicted_config():
    ms = [Measurement("G", "t", CONV, Config({"BLOCK_M": b}), t) for b, t in
          ((64, 30.0), (128, 12.0), (256, 36.0))]
    ms.append(Measurement("G", "u", CONV, Config({"BLOCK_M": 64}), 50.0))  # alone: dropped
    ms.append(Measurement("H", "t", CONV, Config({"BLOCK_M": 64}), 8.0))   # another GPU
    ms.append(Measurement("H", "t", CONV, Config({"BLOCK_M": 128}), 9.0))
    test = np.arange(len(ms))
    pred = np.array([20.0, 10.0, 40.0, 1.0, 4.0, 5.0])
    kept, scaled = anchored_predictions(ms, test, pred)
    # anchors: row 1 (pred 10, measured 12: x1.2) and row 4 (pred 4, measured 8: x2)
    assert kept.tolist() == [0, 2, 5]
    assert scaled == pytest.approx([24.0, 48.0, 10.0])


def test_anchored_evaluation_removes_a_layer_scale_and_trains_once_per_fold():
    ms = _synthetic(4)
    calls: list[int] = []
    base = _oracle(scale=1.5)

    def counted(all_ms, train):
        calls.append(len(train))
        return base(all_ms, train)

    fit = memoized(counted)
    (plain,) = leave_one_layer_out(ms, fit)
    (anchored,) = leave_one_layer_out(ms, fit, anchor=True)
    assert len(calls) == 4  # the second evaluation reused the four folds' models
    assert plain.median_ape == pytest.approx(50.0)
    assert anchored.median_ape == pytest.approx(0.0, abs=1e-9)
    assert anchored.n_configs == len(ms) - 4  # one anchor per held-out workload
    assert anchored.kendall_tau == pytest.approx(1.0)


def test_calibrate_fits_constants_to_data():
    truth = DEFAULT_PARAMS.__class__(overhead_us=7.0, step_us=0.05, l2_bytes_per_s=8e12,
                                     efficiency=(("int8", 0.6),))
    ms = []
    for m in _synthetic(5):
        t = estimate(geometry(m.template, m.workload, m.config), m.workload, H100,
                     truth).total_us
        ms.append(Measurement("G", m.template, m.workload, m.config, t, "events", "s", "x"))
    before = median_ape(ms)
    assert before > 10.0  # the default constants are off for this data
    fitted = fit_params(ms)
    assert median_ape(ms, fitted) < min(5.0, before / 4)
    assert fitted != DEFAULT_PARAMS


def test_fp16_estimate_is_positive_and_grows_with_the_batch():
    small, big = (fp16_estimate_us(CONV.replace(N=n)) for n in (1, 256))
    assert FP16_PARAMS.overhead_us < small < big
    assert fp16_estimate_us(GemmWorkload(M=8192, N=8192, K=8192), "NVIDIA H200") > 500


def test_predict_results_batches_per_template():
    from types import SimpleNamespace

    from lowbit.perfmodel.predict import predict_many, predict_results

    model = LearnedModel()  # analytic only: no training here
    cfgs = [Config({**IGEMM, "BLOCK_M": bm}) for bm in (64, 128)]
    results = [SimpleNamespace(template="triton.conv2d_int8", config=cfgs[0]),
               SimpleNamespace(template=TORCH_FP16, config=Config()),
               SimpleNamespace(template="triton.conv2d_int8", config=cfgs[1])]
    got = predict_results(CONV, results, "NVIDIA H100 80GB HBM3", model)
    want = predict_many("triton.conv2d_int8", CONV, cfgs, None, model)
    assert got[0] == pytest.approx(want[0]) and got[2] == pytest.approx(want[1])
    assert got[1] == pytest.approx(fp16_estimate_us(CONV))
    graph = predict_many("triton.conv2d_int8", CONV, cfgs, None, model, cuda_graph=True)
    assert np.all(graph < want)


def test_benchmark_partial_runs_hold_out_a_sample_of_the_templates_layers():
    """benchmarks/perfmodel.py --templates / --max-layers / --quick: the layers held out."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from perfmodel import held_out_layers

    ms = _synthetic(4)  # 4 layers x 9 configs of triton.conv2d_int8
    other = Measurement("G", "triton.gemm_int8", GemmWorkload(M=64, N=64, K=64),
                        Config(IGEMM), 5.0)
    ms.append(other)
    layers = sorted({m.layer for m in ms if m.template == "triton.conv2d_int8"})
    assert held_out_layers(ms, False, None, None) is None  # the full run: every layer
    assert held_out_layers(ms, False, ["triton.conv2d_int8"], None) == layers
    assert held_out_layers(ms, False, ["triton.gemm_int8"], None) == [other.layer]
    assert held_out_layers(ms, False, ["triton.conv2d_int8"], 2) == [layers[0], layers[2]]
    assert held_out_layers(ms, True, None, None) == []  # no layer has >= 100 rows


def test_benchmark_gpu_run_rows_with_a_fake_measurer(monkeypatch):
    """benchmarks/perfmodel.py --gpu's bookkeeping without a GPU: per layer the dispatch pick,
    the defaults, the model's top 3 (`choose_measured`'s candidates) measured once each; the
    dispatch row's best of the top 3 is the fastest of those measurements."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import perfmodel as bench
    from lowbit.perfmodel import predict
    from lowbit.tune import dispatch

    monkeypatch.setattr(predict, "default_model", lambda *a, **k: LearnedModel())
    monkeypatch.setattr(dispatch, "default_model", lambda *a, **k: LearnedModel())

    class Result:
        def __init__(self, us):
            self.time_us, self.error = us, None

    class Measurer:  # every k-th candidate of a call fails, the others take 10 + k us
        def measure(self, inputs):
            return [Result(None if k == 1 else 10.0 + k) for k in range(len(inputs))]

        def close(self):
            pass

    run = bench.GpuRun(60, measurer=Measurer(), fp16_us=lambda wl: 12.0)
    layers = {n: (wl, new) for n, wl, new in bench.all_layers()}
    wl, new = layers["resnet18_56x56_64to64_s1"]
    run.measure_layer("resnet18_56x56_64to64_s1", wl, new, bench.GPU_TEMPLATES)
    meas = [r for r in run.rows if r["kind"] == "measurement"]
    (row,) = [r for r in run.rows if r["kind"] == "dispatch"]
    top = run.top["resnet18_56x56_64to64_s1"]
    assert len(top) == bench.TOP_K and meas[0]["role"] == "dispatch"
    times = {(m["template"], Config(m["config"])): m["time_us"] for m in meas}
    want = min(t for t in (times[tc] for tc in top) if t is not None)
    assert row["measured_top3_us"] == want
    assert row["tuned_us"] == 10.0 and row["measured_top3_over_tuned"] == round(want / 10.0, 3)
    assert row["n_failed"] == 1 and row["cudnn_fp16_us"] == 12.0
