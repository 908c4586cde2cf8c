"""benchmarks/report.py: BENCHMARKS.md's tables are what the committed results files give, every
figure links to a file that exists, only cited files get a link definition, every results file
is counted once, and each suite renders a synthetic results file."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import report  # noqa: E402
import report_kernels  # noqa: E402

VERSIONS = {"torch": "2.11.0+cu130", "triton": "3.6.0", "cuda": "13.0", "lowbit": "abcdef1234",
            "driver": "580.1"}
GPU = "NVIDIA Test GPU"


def _doc(benchmark: str, rows: list, **extra) -> dict:
    return {"benchmark": benchmark, "gpu": GPU, "date": "2026-01-02", "versions": VERSIONS,
            **extra, "rows": rows}


def _bit_row(time_us: float, int8: float, verified: bool = True) -> dict:
    return {"workload": "resnet50_s4_3x3_b256", "precision": "w1a2", "impl": "cuda.bitserial",
            "config": {"BM": 64, "BN": 128, "KT": 1, "STAGES": 3, "MMA": "wgmma", "PERSIST": 1,
                       "TAP_SHIFT": 1, "TEAMS": 2, "THR_PAIRS": 1, "ROWSUM": "slab"},
            "time_us": time_us, "floor_us": 11.5, "default_config_us": 24.0,
            "verified": verified,
            "baselines_us": {"int8_best": int8, "cudnn_fp16": 100.0, "int_mm_im2col": 450.0}}


def _chain_config(bn: int, start: float, after: float) -> dict:
    return {"config": {"BN": bn}, "exact": True, "isolated_us": 5.1, "pair_us": 5.0,
            "chained_start_us": start, "chained_after_mma_us": after,
            "chained_us": min(start, after), "chained_auto_us": min(start, after)}


# one or more synthetic files per registered suite: {suite: [(file name, document)]}
SYNTHETIC = {
    "conv": [("conv-20260102-000000.json", _doc("conv", [
        {"workload": "resnet50_s4_3x3_b256", "precision": "w8a8",
         "impl": "triton.conv2d_int8_tma", "config": {"LOOP_ORDER": "crs", "SPLIT_K": 2},
         "time_us": 60.0, "floor_us": 51.0,
         "baselines_us": {"cudnn_fp16": 90.0, "int_mm_im2col": 420.0, "default_config": 72.0,
                          "triton.conv2d_int8": 70.0, "triton.conv2d_int8_tma": 60.0},
         "cuda_graph_us": {"triton.conv2d_int8_tma": 55.0, "cudnn_fp16": 99.0}}]))],
    "gemm": [("gemm-20260102-000000.json", _doc("gemm", [
        {"workload": "fc_b128_4096to4096", "precision": "w8a8", "impl": "triton.gemm_int8",
         "config": {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 2,
                    "SPLIT_SUM": "last_program"},
         "time_us": 20.0, "floor_us": 6.5,
         "baselines_us": {"int_mm": 18.0, "fp16_matmul": 24.0, "default_config": 40.0,
                          "cuda.int8_wgmma": 31.0},
         "cuda_graph_us": {"ours": 12.0, "int_mm": 10.8}}]))],
    "accuracy_sweep": [("accuracy_sweep-20260102-000000.json", _doc("accuracy_sweep", [
        {"dataset": "digits_hard", "model": "digits_cnn", "precision": "w2a2", "method": "lsq",
         "qat_epochs": 3, "qat_lr": 0.001, "distill": 0.0, "n_seeds": 10,
         "paired_minus_fp32_mean": -4.139, "paired_minus_fp32_se": 0.237},
        {"dataset": "digits_hard", "model": "digits_cnn", "precision": "w2a2", "method": "lsq",
         "qat_epochs": 10, "qat_lr": 0.001, "distill": 0.0, "n_seeds": 10,
         "paired_minus_fp32_mean": -2.467, "paired_minus_fp32_se": 0.292}]))],
    "gemv": [("gemv-20260102-000000.json", _doc("gemv", [
        {"workload": "gemm_8x1000x2048", "M": 8, "N": 1000, "K": 2048, "floor_us": 0.49,
         "impls": {"triton.gemv_int8": {"time_us": 7.5, "graph_us": 3.6, "exact": True}},
         "fp16_matmul": {"time_us": 9.75, "graph_us": 5.0},
         "baselines_us": {"cuda.int8_wgmma_default": 15.7, "triton.gemm_int8_default": 21.0},
         "engine_default": "triton.gemv_int8"},
        {"workload": "conv_b1_7x7_3x3_512to512", "op": "conv2d", "gemm_shape": [49, 512, 4608],
         "floor_us": 0.55,
         "impls": {"triton.gemv_int8": {"time_us": 10.0, "graph_us": 7.0, "exact": True}},
         "fp16_conv": {"time_us": 15.0, "graph_us": 11.2},
         "baselines_us": {"triton.conv2d_int8_default": 40.0, "cuda.int8_wgmma_default": 29.0},
         "engine_default": "cuda.int8_wgmma"}]))],
    "bitserial": [
        ("bitserial-20260101-000000.json", _doc("bitserial", [_bit_row(21.0, 50.0)],
                                                 targets={"w1a2_vs_int8_conv_b256": 2.5,
                                                          "made_up_target": 1.0})),
        # the fastest bit-exact row wins; the unverified one, faster still, does not count
        ("bitserial-20260102-000000.json", _doc("bitserial", [_bit_row(20.0, 56.0),
                                                               _bit_row(5.0, 56.0, False)],
                                                 targets={"w1a2_vs_int8_conv_b256": 2.5,
                                                          "made_up_target": 1.0}))],
    "layer_chain": [("layer_chain-20260102-000000.json", _doc("layer_chain", [
        {"workload": "apconv_b1_c1024", "precision": "w1a2", "floor_us": 0.94,
         "isolated_us": 5.12, "pair_us": 5.04, "chained_us": 4.42, "chained_auto_us": 4.42,
         "apnn_tc_published_us": 17.0,
         "empty": {"pair_us": 1.22, "chained_us": 0.72},
         "baselines_us": {"cudnn_fp16": 18.0, "cudnn_fp16_pair": 18.1},
         "configs": [_chain_config(32, 11.0, 5.96), _chain_config(64, 4.42, 4.82)]}]))],
    "mma_ablation": [("mma_ablation-20260102-000000.json", _doc("mma_ablation", [
        {"workload": "resnet50_s3_3x3_b256", "impl": "cuda.mma_conv_s8", "step": step,
         "time_us": t, "floor_us": 51.1, "baselines_us": {"cudnn_fp16": 98.7}}
        for step, t in (("default", 424.4), ("tuned_tiles", 202.0),
                        ("register_packing", 193.1), ("duplicate_aware_load", 222.4))]
        + [{"workload": "resnet50_s3_3x3_b256", "impl": "cuda.mma_conv_s4", "step": "default",
            "time_us": 665.7, "floor_us": 51.1, "baselines_us": {"cudnn_fp16": 98.7}}]))],
    "apconv_floor": [("apconv_floor-20260102-s1.json", {"gpu": GPU, "versions": VERSIONS, "rows": [
        {"precision": "w1a2", "median_us": {"empty_bn32": 1.1, "cp_async_bn32": 3.41,
                                            "tma_px_bn64": 2.08, "real_default": 5.12}}]})],
    "b1_mma_peak": [("b1_mma_peak-20260102.json", [
        {"kind": "mma.sync m16n8k256", "tops": 9000.0},
        {"kind": "wgmma m64n128k256 ss swz0", "tops": 14600.0},
        {"kind": "wgmma m64n128k256 rs swz32", "tops": 15100.0}])],
    "tuning": [
        ("tuning-20260102-000000.json", _doc("tuning", [
            {"workload": "resnet50_s3_3x3", "space_size": 324, "exhaustive_best_us": 13.8,
             "trials_to_095": {"random": 246, "sa": 162, "diversity": 134, "tpe": 88},
             "trials_to_095_by_seed": {"random": [172, 316], "sa": [40, 254],
                                       "diversity": [45, 256], "tpe": [41, 186]},
             "quality_at_500": 1.0, "wall_s_500": 53.6}],
            tables=["tables-20260102-000000.json"], timed="timed-20260102-000000.json",
            seeds=2)),
        ("timed-20260102-000000.json", _doc("tuning_timed", [
            {"workload": "resnet50_s3_3x3", "trials": 324, "space_size": 324, "wall_s": 53.6,
             "best_us": 13.2, "default_us": 21.2, "failures": 0},
            {"workload": "resnet50_s4_3x3", "trials": 342, "space_size": 342, "wall_s": 46.1,
             "best_us": 14.2, "default_us": 26.8, "failures": 0}],
            template="triton.conv2d_int8", strategy="diversity")),
        # a later timed tune of one layer supersedes that layer's row only
        ("timed-20260103-000000.json", {**_doc("tuning_timed", [
            {"workload": "resnet50_s4_3x3", "trials": 300, "space_size": 7866, "wall_s": 42.5,
             "best_us": 13.0, "default_us": 27.0, "best_template": "triton.conv2d_int8_tma",
             "failures": 0}], templates=["triton.conv2d_int8", "triton.conv2d_int8_tma"],
            strategy="diversity"), "date": "2026-01-03"}),
        ("tables-20260102-000000.json", {"benchmark": "tuning_tables", "gpu": GPU,
                                         "versions": VERSIONS, "layers": []}),
        ("multigpu-20260102-000000.json", {
            "benchmark": "tuning_multigpu", "gpu": GPU, "versions": VERSIONS,
            "workload": "resnet50_s3_3x3_b256", "trials": 128,
            "runs": [{"gpus": 1, "wall_s": 37.9, "best_us": 98.1},
                     {"gpus": 2, "wall_s": 35.5, "best_us": 98.2}]})],
    "accuracy": [("accuracy-20260102-000000.json", _doc("accuracy", [
        {"precision": "fp32", "method": "fp32", "accuracy_mean": 98.0, "accuracy_std": 0.5,
         "accuracies": [97.5, 98.5], "seeds": [0, 1]},
        {"precision": "w2a2", "method": "max", "accuracy_mean": 96.0, "accuracy_std": 1.0,
         "accuracies": [95.0, 97.0], "seeds": [0, 1], "integer_accuracy_mean": 96.0},
        {"precision": "w2a2", "method": "rand", "accuracy_mean": 97.0, "accuracy_std": 1.0,
         "accuracies": [96.5, 97.5], "seeds": [0, 1], "integer_accuracy_mean": 97.001},
        {"precision": "w2a2", "method": "brevitas", "accuracy_mean": 96.5, "accuracy_std": 0.5,
         "accuracies": [96.0, 97.0], "seeds": [0, 1]},
        {"precision": "w1a2", "method": "max", "accuracy_mean": 90.0, "accuracy_std": 2.0,
         "accuracies": [88.0, 92.0], "seeds": [0, 1]}],
        targets={"rand>=max@w2a2": True, "rand>=max@w1a2": False},
        target_details={"rand>=max@w1a2": {"paired_mean": -1.5, "paired_se": 0.5}})),
                 # a later run of another (dataset, model) pair: both pairs are shown
                 ("accuracy-20260103-000000.json", _doc("accuracy", [
                     {"dataset": "digits_hard", "model": "digits_resnet", "precision": "w1a2",
                      "method": "lsq", "accuracy_mean": 80.0, "accuracy_std": 2.0,
                      "accuracies": [78.0, 80.0, 82.0]}]))],
    "wide_bits": [("wide_bits-20260102-000000.json", _doc("wide_bits", [
        {"seed": s, "precision": "w2a2", "wide_bits": b, "top1_agreement": a,
         "accuracy": 85.0 + d, "integer_accuracy": 85.0, "max_logit_diff": 0.1 * b / 8}
        for s, (b, a, d) in enumerate([(16, 0.998, 0.1), (16, 1.0, 0.0), (24, 1.0, 0.0)])]))],
    "onnx_bridge": [("onnx_bridge-20260102-000000.json", _doc("onnx_bridge", [
        {"kind": "agreement", "images": 450, "executor": "gpu", "compiled_agreement": 0.9978,
         "fake_quant_agreement": 1.0, "brevitas_accuracy": 0.96, "compiled_accuracy": 0.9578,
         "compiled_max_logit_diff": 0.0012, "float_fallbacks": 0},
        {"kind": "time", "batch": 256, "lowbit_ms": 0.0312, "speedup_vs_fp16_compile": 2.0,
         "baselines_ms": {"fp16_eager": 0.2, "fp16_cuda_graph": 0.05, "fp16_compile": 0.0624}}],
        setup={"dataset": "digits", "model": "Brevitas digits CNN", "epochs": 10,
               "exporter": "dynamo", "compile_mode": "default"}))],
    "tuning_network": [
        ("tuning_network-20260102-000000.json", _doc("tuning_network", [
            {"row": "tuning", "model": "resnet18", "batch": 8, "precision": "w1a2",
             "residual_bits": 8, "gpus": 1, "budget_s": 60.0, "tune_wall_s": 60.5,
             "trials": 373, "failures": 2, "workloads": 19, "network_ms_before": 0.2,
             "network_ms_after": 0.16, "network_ms_model": 0.17, "tuned_logits_equal": True},
            {"row": "network", "chooser": "tuned", "model": "resnet18", "time_ms": 0.16}])),
        # a later session of the same network replaces it; another network adds a row
        ("tuning_network-20260103-000000.json", _doc("tuning_network", [
            {"row": "tuning", "model": "resnet18", "batch": 8, "precision": "w1a2",
             "residual_bits": 8, "gpus": 2, "budget_s": 30.0, "tune_wall_s": 31.0,
             "trials": 100, "failures": 0, "workloads": 19, "network_ms_before": 0.2,
             "network_ms_after": 0.1, "network_ms_model": None, "tuned_logits_equal": False},
            {"row": "tuning", "model": "resnet50", "batch": 256, "precision": "w1a2",
             "residual_bits": None, "gpus": 1, "budget_s": 100.0, "tune_wall_s": 101.0,
             "trials": 174, "failures": 0, "workloads": 32, "network_ms_before": 4.2,
             "network_ms_after": 4.0, "network_ms_model": 11.0,
             "tuned_logits_equal": True}]))],
    "residual_bits": [
        ("residual_bits-20260102-000000.json", _doc("residual_bits", [
            {"seed": s, "precision": "w2a2", "residual_bits": b, "accuracy": a,
             "compiled_accuracy": c, "agreement": g}
            for s, b, a, c, g in [(0, None, 85.0, 85.0, 1.0), (1, None, 86.0, 86.0, 1.0),
                                  (0, 8, 84.5, 84.5, 0.999), (1, 8, 86.0, 85.9, 0.998)]],
            setup={"dataset": "digits_hard", "model": "digits_resnet", "seeds": [0, 1]},
            summary={"w2a2": {"8_minus_none": {"compiled": {
                "mean": -0.3, "std": 0.283, "se": 0.2, "per_seed": [-0.5, -0.1]}}}},
            targets={"residual8_within_0.5_of_24bit@w2a2": True})),
        # later, fewer seeds: the run with the most seeds is shown
        ("residual_bits-20260103-000000.json", _doc("residual_bits", [
            {"seed": 0, "precision": "w2a2", "residual_bits": None, "accuracy": 50.0,
             "compiled_accuracy": 50.0, "agreement": 1.0}], setup={"seeds": [0]}))],
    "autoprecision": [
        # more seeds, no measurements: its accuracy table is shown, though older
        ("autoprecision-20260101-000000.json", _doc("autoprecision", [
            {"plan": "auto at w2a2 bits", "seeds": [0, 1, 2], "accuracy_mean": 80.0,
             "accuracy_std": 1.0, "predicted_latency_us_mean": 50.0,
             "avg_weight_bits_mean": 1.96},
            {"plan": "uniform w2a2", "seeds": [0, 1, 2], "accuracy_mean": 77.0,
             "accuracy_std": 1.0, "predicted_latency_us_mean": 50.0, "avg_weight_bits_mean": 2.0,
             "auto at w2a2 bits minus_mean": 3.0, "auto at w2a2 bits minus_se": 0.5}],
            setup={"dataset": "digits_hard", "model": "digits_resnet", "seeds": 3},
            targets={"more_accurate_than_uniform_w2a2_at_its_bits_by_2se": True,
                     "bits_paired_mean": 3.0})),
        # fewer seeds, measured on a GPU: its latencies are shown
        ("autoprecision-20260102-000000.json", _doc("autoprecision", [
            {"plan": "uniform w2a2", "seeds": [0, 1], "accuracy_mean": 70.0, "accuracy_std": 1.0,
             "measured_latency_ms_mean": 0.25}], setup={"seeds": 2},
            per_seed=[{"seed": s, "plan": "uniform w2a2", "measured_latency_ms": ms}
                      for s, ms in ((0, 0.2), (1, 0.3))] + [{"seed": 0, "plan": "front"}]))],
    "network": [("network-20260102-000000.json", _doc("network", [
        {"model": "resnet18", "batch": 8, "precision": "w1a2", "time_ms": 0.25,
         "images_per_s": 32000.0,
         "baselines_ms": {"fp16_eager": 1.5, "fp16_cuda_graph": 0.5, "fp16_compile": 0.3},
         "layers": []},
        {"model": "resnet18", "batch": 8, "precision": "w1a2", "exact_bias": False,
         "time_ms": 0.2, "images_per_s": 40000.0, "floor_ms": 0.02, "host_overhead_us": 30.0,
         "weights_bytes": 1_000, "fp16_weights_bytes": 16_000, "peak_activation_bytes": 3_000,
         "fp16_peak_activation_bytes": 2_000,
         "baselines_ms": {"fp16_eager": 1.5, "fp16_cuda_graph": 0.5}, "layers": []},
        {"model": "resnet50", "batch": 256, "precision": "w1a2", "time_ms": 14.0,
         "images_per_s": 18000.0, "baselines_ms": {"fp16_cuda_graph": 14.0},
         "layers": [{"name": f"layer.l{i}", "impl": "cuda.bitserial_wgmma", "time_us": t,
                     "floor_us": t / 3, "fp16_us": 100.0,
                     "launches_us": [t * 0.6, t * 0.4] if i == 0 else None}
                    for i, t in enumerate((1500.0, 10.0, 900.0, 20.0, 700.0, 30.0, 40.0))]},
        {"model": "vgg16", "batch": 8, "precision": "w1a2", "error": "ValueError: x"}])),
                # a later run of :wide16 cases only: it must not replace the default rows
                ("network-20260103-000000.json", _doc("network", [
                    {"model": "resnet18", "batch": 8, "precision": "w1a2", "wide_bits": 16,
                     "time_ms": 0.19, "images_per_s": 42000.0,
                     "baselines_ms": {"fp16_cuda_graph": 0.5}, "layers": []},
                    # an ablation newer than its default row: shown
                    {"model": "resnet18", "batch": 8, "precision": "w1a2", "chooser": "model",
                     "time_ms": 0.3, "images_per_s": 26000.0,
                     "baselines_ms": {"fp16_cuda_graph": 0.5}, "layers": []}])),
                ("network-20260101-000000.json", _doc("network", [
                    # an ablation older than its default row: left out
                    {"model": "resnet18", "batch": 8, "precision": "w1a2", "fuse_outputs": False,
                     "time_ms": 0.9, "images_per_s": 9000.0,
                     "baselines_ms": {"fp16_cuda_graph": 0.5}, "layers": []}]))],
    "qat_schedule": [("qat_schedule-20260102-000000.json", dict(_doc("qat_schedule", [
        {"precision": "w2a2", "method": "rand", "accuracy_mean": 66.5},
        {"precision": "w2a2", "method": "rand+mix", "accuracy_mean": 63.1,
         "paired_minus_rand_mean": -3.4, "paired_minus_rand_se": 3.7}]),
        setup={"model": "digits_resnet", "qat_steps": 100, "mix_warmup": 0.25, "seeds": 10}))],
    "netops": [("netops-20260102-000000.json", _doc("netops", [
        {"op": "stem", "workload": "224x224x3_to_56x56x64", "batch": 8, "impl": "triton.stem",
         "time_us": 40.0, "graph_us": 33.0, "floor_us": 2.2,
         "baselines_us": {"fp16_cuda_graph": 99.0}}]))],
    "perfmodel": [("perfmodel-20260102-000000.json", _doc("perfmodel", [
        {"kind": "model_accuracy", "template": "triton.conv2d_int8", "model": "learned",
         "data": "recorded", "median_ape": 11.4, "kendall_tau": 0.47, "n_layers": 25,
         "n_configs": 3040},
        {"kind": "pruned_tuner", "template": "triton.conv2d_int8", "workload": "a",
         "space_size": 300, "fraction_measured_to_097": 0.02},
        {"kind": "pruned_tuner", "template": "triton.conv2d_int8", "workload": "b",
         "space_size": 300, "fraction_measured_to_097": 0.5},
        {"kind": "dispatch", "workload": "a", "template": "triton.conv2d_int8",
         "dispatch_us": 12.0, "tuned_us": 10.0, "dispatch_over_tuned": 1.2}]))],
    "gpu_tests": [("gpu_tests-20260102-000000.json", _doc("gpu_tests", [
        {"step": "tests", "files": ["tests/test_a.py", "tests/test_b.py"], "tests": 6,
         "passed": 3, "failed": 1, "errors": 0, "skipped": 2, "duration_s": 12.3,
         "complete": True}]))],
    # a probe's output as the probe wrote it (no "benchmark" field: its file name says it)
    "probes": [("epilogue_probe-20260102-000000.json", {"gpu": GPU, "versions": VERSIONS,
                                                        "rows": [{"a": 1}, {"a": 2}]})],
}
# what each suite's section must show for its synthetic files (labels: the cited file's stem)
EXPECTED = {
    "conv": ["|[60.0][conv-20260102-000000]|tma crs split 2|", "|1.50|7.00|", "|1.80 (55.0)|",
             "b256 conv vs cuDNN fp16 >= 1.8: met on 0 of 1"],
    "gemm": ["[20.0][gemm-20260102-000000]", "128x64x128, split 2 (last_program)", "|0.90|",
             "0.90 (10.8 / 12.0)", "FC vs `_int_mm` >= 1.0: met on 0 of 1"],
    "accuracy_sweep": ["|dataset|model|precision|method|3 ep, lr 0.001|10 ep, lr 0.001|",
                       "|digits_hard|digits_cnn|w2a2|lsq|-4.14 +- 0.24 (10)|-2.47 +- 0.29 (10)|"],
    "gemv": ["|gemm_8x1000x2048|[7.50][gemv-20260102-000000]|0.49|15.7|21.0|9.75|1.30|1.39|"
             "triton.gemv_int8|",
             "|conv_b1_7x7_3x3_512to512|49x512x4608|[10.0][gemv-20260102-000000]|0.55|40.0|-|"
             "29.0|15.0|1.50|1.60|cuda.int8_wgmma|"],
    "bitserial": ["[20.0][bitserial-20260102-000000]", "|2.80|", "|tap-shift persistent 64x128|",
                  "`w1a2_vs_int8_conv_b256` >= 2.5: met on 1 of 1",
                  "`made_up_target` >= 1.0: not evaluated"],
    "layer_chain": ["|[5.12][layer_chain-20260102-000000]|5.04|4.42 (start, 64 wide)|",
                    "1.22 / 0.72", "|3.85|"],
    "mma_ablation": ["424.4 (8.31x)", "202.0 (3.95x)", "|665.7|", "|98.7|"],
    "apconv_floor": ["|16-byte cp.async|3.41|-|", "|committed default kernel (whole)|5.12|-|",
                     "|tensor copies, 128-byte boxes|-|2.08|"],
    "b1_mma_peak": ["File: [b1_mma_peak-20260102.json][b1_mma_peak-20260102].",
                    "|mma.sync m16n8k256|9,000|", "|wgmma m64n128k256|15,100|14,600 - 15,100|2|"],
    "tuning": ["246 [172-316] / 162 [40-254] / 134 [45-256] / 88 [41-186]", "|1.61|",
               "|resnet50_s3_3x3|igemm|diversity|324|324|53.6|[13.2][timed-20260102-000000]|",
               "|resnet50_s4_3x3|igemm, tma|diversity|300|7866|42.5|"
               "[13.0 (tma)][timed-20260103-000000]|27.0|2.08|0|2026-01-03|",
               "2 GPU(s): 35.5 s, best 98.2 us",
               "timed: [tables-20260102-000000.json][tables-20260102-000000])",
               "|13.8|[1.61][timed-20260102-000000]|",  # the ratio cites the timed run's file
               "([timed-20260102-000000.json][timed-20260102-000000]). File:"],
    "accuracy": ["|dataset|model|FP32|precision|MAX|Rand|Brevitas|LSQ|best vs Brevitas|seeds|",
                 "|-|-|98.00 +- 0.50|[w2a2][accuracy-20260102-000000]|96.00 +- 1.00|"
                 "97.00 +- 1.00|96.50 +- 0.50|-|rand +0.50 +- 0.00|2|",
                 "||||[w1a2][accuracy-20260102-000000]|90.00 +- 2.00|-|-|-||2|",
                 "|digits_hard|digits_resnet||[w1a2][accuracy-20260103-000000]|-|-|-|"
                 "80.00 +- 2.00||3|",
                 "the same accuracy in 1 of 2 cells; differs in w2a2 rand 97.000 -> 97.001.",
                 "`rand>=max` met in 1 of 2 (missed: w1a2 -1.50 +- 0.50)"],
    "wide_bits": ["|w2a2|16|99.90|99.80|+0.05|0.200|2|", "|w2a2|24|100.00|100.00|+0.00|0.300|1|"],
    "onnx_bridge": ["|gpu|450|[99.78][onnx_bridge-20260102-000000]|100.00|96.00|95.78|0.0012|0|",
                    "|256|[0.0312][onnx_bridge-20260102-000000]|0.2000|0.0500|0.0624|2.00|"],
    "tuning_network": ["File: [tuning_network-20260103-000000.json]",
                       "|resnet18|8|w1a2/res8|2|30|31|100 / 0|19|0.200|0.100|2.00|-|-|NO|",
                       "|resnet50|256|w1a2|1|100|101|174 / 0|32|4.200|4.000|1.05|11.000|2.75|"
                       "yes|"],
    "residual_bits": ["|w2a2|none (24-bit stream)|85.50 +- 0.71|85.50|-|100.00|100.00|2|",
                      "|w2a2|8|85.25 +- 1.06|85.20|-0.30 +- 0.20 (std 0.28)|99.85|99.80|2|",
                      "File: [residual_bits-20260102-000000.json]"
                      "[residual_bits-20260102-000000].",
                      "`residual8_within_0.5_of_24bit@w2a2` met"],
    "autoprecision": ["Accuracy: [autoprecision-20260101-000000.json]"
                      "[autoprecision-20260101-000000], NVIDIA Test GPU, 3 seeds",
                      "|uniform w2a2|77.00 +- 1.00|50.00|2.00|+3.00 +- 0.50|",
                      "`more_accurate_than_uniform_w2a2_at_its_bits_by_2se` met",
                      "Measured latency: [autoprecision-20260102-000000.json]"
                      "[autoprecision-20260102-000000], NVIDIA Test GPU, 2 seeds",
                      "|uniform w2a2|[0.2500][autoprecision-20260102-000000]|0.2000 - 0.3000|2|"],
    "network": ["|resnet18|8|w1a2|exact|24|default|[0.250][network-20260102-000000]|32,000|6.00|"
                "2.00|1.20|",
                "|resnet18|8|w1a2|exact|16|default|[0.190][network-20260103-000000]|42,000|",
                "|resnet18|8|w1a2|exact|24|model|[0.300][network-20260103-000000]|26,000|",
                "|resnet18|8|w1a2|kernel|24|default|[0.200][network-20260102-000000]|40,000|7.50|"
                "2.50|-|0.020|30.0|0.06|1.50|",
                "Largest steps of resnet50 b256 (exact bias, wide 24), 2026-01-02",
                "|w1a2|layer.l0|cuda.bitserial_wgmma|1500.0|900.0 + 600.0|500.0|100.0|",
                "|w1a2|layer.l4|cuda.bitserial_wgmma|700.0|-|233.3|100.0|"],
    "qat_schedule": ["|digits_resnet|100|0.25|10|w2a2|66.50|"
                     "[63.10][qat_schedule-20260102-000000]|-3.40 +- 3.70|"],
    "netops": ["|stem|224x224x3_to_56x56x64|8|triton.stem|"
               "[33.0][netops-20260102-000000]|2.20|15.00|99.0|3.00|"],
    "gpu_tests": ["|run|lowbit|step|test files|passed|failed / errors|skipped|s|",
                  "|20260102-000000|abcdef1|tests|test_a, test_b|"
                  "[3][gpu_tests-20260102-000000]|1 / 0|2|12|"],
    "probes": ["Outputs that NOTES.md quotes, NVIDIA Test GPU: `epilogue_probe` "
               "[20260102-000000][epilogue_probe-20260102-000000]."],
    "perfmodel": ["|triton.conv2d_int8|recorded|[11.4][perfmodel-20260102-000000] (0.47)|25|3040|",
                  "median fraction of the space measured to reach 0.97x of the best 0.260 "
                  "(max 0.500), 1 of 2 at or under 10%",
                  "median / best measured 1.20x, 1 within 1.25x"],
}
# what the one line of each concluded suite's section says (EXPECTED: its tables, which the
# line links)
SUMMARY = {
    "mma_ablation": ["resnet50_s3_3x3_b256 424.4 (8.31x) -> register_packing 193.1 (3.78x), "
                     "cuDNN fp16 98.7", "default: 1.6x the s8 default's time",
                     "Tables: [20260102-000000][mma_ablation-20260102-000000]."],
    "apconv_floor": ["w1a2: tensor copies, 128-byte boxes (BN 64) 2.08, an empty kernel 1.10, "
                     "the committed kernel 5.12."],
    "accuracy_sweep": ["digits_cnn w2a2 lsq 10 ep, lr 0.001 -2.47 +- 0.29 (-4.14 +- 0.24)"],
    "qat_schedule": ["over 1 setting (model, QAT steps, warm-up, seeds): w2a2 -3.40 +- 3.70; "
                     "0 of 1 beyond two standard errors"],
    "tuning": ["median over the layers: random 246, sa 162, diversity 134, tpe 88",
               "Timed tunes (`lowbit.tune.tune`) of 2 layers: default / best 1.61-2.08x, "
               "42.5-53.6 s each, 0 failures", "2 GPU(s): 35.5 s, best 98.2 us",
               "5 files of this suite under `gpu-test/`."],  # the line links all 5, inputs too
    "layer_chain": ["apconv_b1_c1024 w1a2 5.04 -> 4.42 (auto 4.42)", "waits: 1.22 -> 0.72 us"],
    "netops": ["stem (triton.stem, 1) 33.0, 15.0x, 3.00"],
    "perfmodel": ["NVIDIA Test GPU: held-out median APE % (Kendall tau) over 1 template "
                  "(recorded): learned 11.4 (0.47)",
                  "median fraction of the space measured to reach 0.97x of the best 0.260 "
                  "(max 0.500), 1 of 2 at or under 10%"],
    "wide_bits": ["w2a2 24 bits 100.00 (+0.00); w2a2 16 bits 99.90 (+0.05) over 3 seeds."],
    "gemm": ["fc_b128_4096to4096 [20.0][gemm-20260102-000000] us, `_int_mm` / ours 0.90, "
             "3.08x floor"],
}
# what a section must not show: superseded rows, and rows a key collision would hide
ABSENT = {
    "tuning": ["|resnet50_s4_3x3|igemm|diversity|342|"],
    "network": ["vgg16", "|layer.l1|", "|layer.l3|", "|default, no fused outputs|"],
    "autoprecision": ["70.00 +- 1.00"],
    "residual_bits": ["50.00"],
}


def _labelled(text: str) -> str:
    """`text` with each numbered link label replaced by the stem of the file it defines."""
    defs = dict(re.findall(r"^\[(\d+)\]: (\S+)$", text, flags=re.M))
    return re.sub(r"\]\[(\d+)\]", lambda m: f"][{Path(defs[m[1]]).stem}]" if m[1] in defs
                  else m[0], text)


def _write(tmp: Path, files: list[tuple[str, object]], gpu_dir: str = "gpu-test") -> Path:
    results = tmp / "results"
    (results / gpu_dir).mkdir(parents=True, exist_ok=True)
    for name, doc in files:
        (results / gpu_dir / name).write_text(json.dumps(doc))
    return results


def _section(text: str, title: str) -> str:
    """The generated section whose heading starts with `title`."""
    start = text.index(f"## {title}")
    nxt = text.find("\n## ", start + 1)
    return text[start:] if nxt < 0 else text[start:nxt]


def test_benchmarks_md_tables_are_what_the_results_files_give():
    generated = report.render(report.load(), report.extra_files())
    doc = (ROOT / "BENCHMARKS.md").read_text()
    assert report.splice(doc, generated) == doc, (
        "BENCHMARKS.md's tables differ from `python benchmarks/report.py`: regenerate them, "
        "do not edit them by hand")


def _links(text: str) -> tuple[dict[str, str], list[str]]:
    """The link definitions of a generated text ({label: path}) and every label its figures
    use, in order (repeats kept)."""
    defined = dict(re.findall(r"^\[([^\]]+)\]: (\S+)$", text, flags=re.M))
    return defined, re.findall(r"\]\[([^\]]+)\]", text)


def _check_links(text: str) -> int:
    """Assert that every cited label is defined and every definition is cited; the number of
    citations checked."""
    defined, used = _links(text)
    undefined = sorted({u for u in used if u not in defined})
    assert not undefined, f"figures cite labels with no link definition: {undefined}"
    unused = sorted(set(defined) - set(used))
    assert not unused, f"link definitions no figure cites: {unused}"
    return len(used)


def test_benchmarks_md_cites_only_defined_files_and_defines_only_cited_ones():
    doc = (ROOT / "BENCHMARKS.md").read_text()
    assert _check_links(doc) >= 100
    defined, _ = _links(doc)
    gone = sorted(p for p in defined.values() if not (ROOT / p).is_file())
    assert not gone, f"BENCHMARKS.md cites files that are not in the tree: {gone}"
    inline = re.findall(r"\]\((benchmarks/results/[^)]+)\)", doc)
    assert inline and all((ROOT / p).is_file() for p in inline)


def test_every_results_file_is_counted_once():
    """The sections' file counts and the "Other files" lines add up to the files on disk."""
    doc = (ROOT / "BENCHMARKS.md").read_text()
    counts = [int(n) for n in re.findall(r"^(\d+) files? of this suite", doc, flags=re.M)]
    others = [int(n) for n in re.findall(r"^- `benchmarks/results/[^`]*`: (\d+) files", doc,
                                          flags=re.M)]
    on_disk = [p for p in (ROOT / "benchmarks" / "results").rglob("*") if p.is_file()]
    assert len(counts) == len(report.render(report.load(), report.extra_files())
                              .split("\n## ")) - 1 - bool(others)
    assert sum(counts) + sum(others) == len(on_disk)


def test_a_cited_label_without_definition_or_an_unused_definition_fails():
    ok = "|x|\n|---|\n|[1.0][1]|\n\n[1]: a.json"
    assert _check_links(ok) == 1
    for broken in ("|[1.0][2]|\n\n[1]: a.json",            # cites an undefined label
                   "|[1.0][1]|\n\n[1]: a.json\n[2]: b.json"):  # defines an unused one
        with pytest.raises(AssertionError):
            _check_links(broken)


def test_every_committed_suite_has_a_renderer_that_works():
    doc = (ROOT / "BENCHMARKS.md").read_text()
    assert "No renderer registered" not in doc
    assert "failed (" not in doc
    suites = {report.suite_of(f.benchmark) for f in report.load()}
    assert suites <= set(report.SUITES) and len(suites) >= 8


def test_each_suite_renders_its_synthetic_file(tmp_path):
    """Each suite's tables show what its synthetic files give; a concluded suite's section
    is its one line instead, linking the files its tables cite."""
    assert set(SYNTHETIC) == set(report.SUITES), "give every new suite a synthetic file here"
    assert set(SUMMARY) == {n for n, s in report.SUITES.items() if s.summary}
    checked = links = 0
    for name, files in SYNTHETIC.items():
        results = _write(tmp_path / name, files)
        loaded = report.load(results, tmp_path / name)
        text = report.render(loaded)
        links += _check_links(text)
        section = _section(_labelled(text), report.SUITES[name].title)
        assert "failed (" not in section and "No renderer" not in section, section
        tables = "\n".join(report.cite_once(report.tables(name, loaded), loaded))
        if name in SUMMARY:
            assert section.count("\nConcluded (") == 1 and "|---|" not in section, section
            for expected in SUMMARY[name]:
                assert expected in section, f"{name}: {expected!r} not in\n{section}"
                checked += 1
        else:  # the section is its tables (their provenance lines may name fewer versions)
            assert all(line in section for line in tables.split("\n")
                       if not line.startswith("Runs: ")), section
        for expected in EXPECTED[name]:
            assert expected in tables, f"{name}: {expected!r} not in\n{tables}"
            checked += 1
        for absent in ABSENT.get(name, []):
            assert absent not in tables, f"{name}: {absent!r} in\n{tables}"
            checked += 1
        n = len(files)
        assert f"{n} file{'s' if n > 1 else ''} of this suite under `gpu-test/`" in text
    assert checked == sum(len(v) for v in (*EXPECTED.values(), *ABSENT.values(),
                                           *SUMMARY.values()))
    assert len(SYNTHETIC) >= 10 and links >= len(SYNTHETIC)


def test_a_table_citing_one_file_names_it_once_above(tmp_path):
    files = SYNTHETIC["conv"]
    row = files[0][1]["rows"][0]
    results = _write(tmp_path, [(files[0][0], {**files[0][1], "rows": [
        row, {**row, "workload": "resnet50_s3_3x3_b256", "time_us": 48.5}]})])
    text = _labelled(report.render(report.load(results, tmp_path)))
    assert text.count("[conv-20260102-000000]") == 1
    assert "File: [conv-20260102-000000.json][conv-20260102-000000]." in text
    assert "|resnet50_s3_3x3_b256|w8a8|48.5|" in text


def test_unknown_suite_and_a_failing_renderer_fall_back_to_the_generic_table(tmp_path):
    results = _write(tmp_path, [
        ("probe-20260102-000000.json", _doc("probe", [{"op": "maxpool", "time_us": 3.25,
                                                       "nested": {"x": 1}}])),
        ("conv-20260102-000000.json", _doc("conv", [{"workload": "w", "precision": "w8a8"}]))])
    text = report.render(report.load(results, tmp_path))
    probe = _section(text, "Suite `probe`")
    assert "No renderer registered" in probe
    assert "|op|time_us|" in probe and "|maxpool|3.25|" in probe
    conv = _section(text, report.SUITES["conv"].title)
    assert "Renderer `render_conv` failed (KeyError: 'time_us')" in conv
    assert "|workload|precision|" in conv


def test_accuracy_rows_of_other_setups_render_without_seed_lists(tmp_path):
    results = _write(tmp_path, [("accuracy-20260103-000000.json", _doc("accuracy", [
        {"model": "resnet18", "precision": "w2a2", "method": "max", "accuracy_mean": 61.5},
        {"model": "resnet18", "precision": "w2a2", "method": "lsq", "accuracy_mean": 66.25,
         "accuracy_std": 0.4}], targets={"lsq_vs_max": 4.75}))])
    section = _section(_labelled(report.render(report.load(results, tmp_path))),
                       report.SUITES["accuracy"].title)
    assert "failed (" not in section
    assert "|model|precision|MAX|LSQ|best vs Brevitas|seeds|" in section
    assert "|resnet18|[w2a2][accuracy-20260103-000000]|61.50|66.25 +- 0.40||-|" in section
    assert "`lsq_vs_max` 4.75" in section


def test_report_is_deterministic_and_independent_of_file_order(tmp_path):
    files = SYNTHETIC["bitserial"] + SYNTHETIC["conv"]
    results = _write(tmp_path, files)
    loaded = report.load(results, tmp_path)
    first = report.render(loaded)
    assert report.render(list(reversed(loaded))) == first
    assert report.render(report.load(results, tmp_path)) == first


def test_splice_replaces_only_between_the_markers():
    doc = f"head\n{report.BEGIN}\nold\n{report.END}\ntail\n"
    assert report.splice(doc, f"{report.BEGIN}\nnew\n{report.END}") == (
        f"head\n{report.BEGIN}\nnew\n{report.END}\ntail\n")
    with pytest.raises(ValueError, match="markers"):
        report.splice("no markers here", "x")


def test_formats_and_targets():
    assert [report.us(v) for v in (None, 3.14159, 12.345, 1036.19)] == ["-", "3.14", "12.3",
                                                                         "1036.2"]
    assert (report.ratio(3.0, 2.0), report.ratio(None, 2.0), report.ratio(1.0, 0)) == (
        "1.50", "-", "-")
    rows = [(None, {"workload": f"l{i}", "precision": "w8a8", "time_us": t, "floor_us": 50.0})
            for i, t in enumerate((60.0, 70.0))]
    upper = report_kernels.Target("floor", 1.3, lambda r: True, report_kernels._over_floor,
                                  at_most=True)
    lower = report_kernels.Target("slow", 1.3, lambda r: True, report_kernels._over_floor)
    never = report_kernels.Target("never", 9.0, lambda r: True, report_kernels._over_floor)
    assert report_kernels.target_lines([upper, lower, never], rows) == [
        "- floor <= 1.3: met on 1 of 2 (missed: l1 w8a8 1.40)",
        "- slow >= 1.3: met on 1 of 2 (missed: l0 w8a8 1.20)",
        "- never >= 9.0: met on 0 of 2"]


def test_the_performance_model_section_cites_the_consolidated_dataset(tmp_path):
    """The dataset file is the perfmodel suite's, counted and linked in its section; a file
    the tables leave uncited shows in the count."""
    from lowbit.perfmodel.consolidated import CONSOLIDATED, write_consolidated
    from lowbit.perfmodel.dataset import consolidate

    results = _write(tmp_path, [*SYNTHETIC["perfmodel"], ("perfmodel-20260101-000000.json",
                                                          _doc("perfmodel", []))])
    timed = SYNTHETIC["tuning"][2]  # a results file with no measurement rows of its own kind
    (results / "gpu-test" / "old").mkdir()
    (results / "gpu-test" / "old" / timed[0]).write_text(json.dumps(timed[1]))
    records = consolidate(results, [results / "gpu-test" / "old" / timed[0]])
    assert report.DATASET_NAME == CONSOLIDATED
    write_consolidated(records, results / CONSOLIDATED)
    (results / "gpu-test" / "old" / timed[0]).unlink()  # folded: it leaves the tree
    text = report.render(report.load(results, tmp_path), report.extra_files(results, tmp_path),
                         root=tmp_path)
    section = _section(text, report.SUITES["perfmodel"].title)
    assert (f"Also trained and evaluated on [{CONSOLIDATED}](results/{CONSOLIDATED}): 0 "
            "measurements of 1 uncited results files (2026-01-03 .. 2026-01-03)") in section
    assert "3 files of this suite: top level 1, `gpu-test/` 2; the tables cite 1." in section
    assert "Other files" not in text


def test_benchmarks_md_is_at_most_40_kb():
    size = len((ROOT / "BENCHMARKS.md").read_bytes())
    assert size <= 40 * 1024, (
        f"BENCHMARKS.md is {size:,} bytes, over 40 KB: show fewer rows (a concluded suite's "
        "summary line, the top rows of a long table), not fewer files")


def _net_row(model: str, time_ms: float) -> dict:
    return {"model": model, "batch": 8, "precision": "w1a2", "time_ms": time_ms,
            "images_per_s": 8e3 / time_ms, "baselines_ms": {"fp16_cuda_graph": 0.5},
            "layers": []}


def test_a_suite_shows_the_gpu_that_ran_last_and_links_the_others(tmp_path):
    """The current table: the runs of the GPU that ran last, with the CPU and offline runs;
    the other GPUs' files are linked in one line and counted."""
    results = tmp_path / "results"
    old, new = "NVIDIA Old GPU", "NVIDIA New GPU"
    for gpu_dir, name, doc in [
            ("nvidia-old-gpu", "network-20260102-000000.json",
             {**_doc("network", [_net_row("resnet18", 0.5), _net_row("alexnet", 0.1)]),
              "gpu": old}),
            ("nvidia-new-gpu", "network-20260103-000000.json",
             {**_doc("network", [_net_row("resnet18", 0.25)]), "gpu": new, "date": "2026-01-03"}),
            # an offline evaluation filed under a GPU's folder, later: not a run of that GPU
            ("nvidia-old-gpu", "perfmodel-20260105-000000.json",
             {**SYNTHETIC["perfmodel"][0][1], "gpu": f"offline: recorded measurements on {old}",
              "date": "2026-01-05"}),
            ("cpu", "wide_bits-20260101-000000.json",
             {**SYNTHETIC["wide_bits"][0][1], "gpu": "cpu"})]:
        (results / gpu_dir).mkdir(parents=True, exist_ok=True)
        (results / gpu_dir / name).write_text(json.dumps(doc))
    loaded = report.load(results, tmp_path)
    assert [f.on_gpu for f in loaded] == [False, True, True, False]  # cpu, new, old, offline
    shown, older = report.current_and_older([f for f in loaded if f.benchmark == "network"])
    assert [f.gpu for f in shown] == [new] and list(older) == [old]
    shown, older = report.current_and_older(loaded)
    assert {f.gpu for f in shown} == {"cpu", new, f"offline: recorded measurements on {old}"}
    raw = report.render(loaded)
    assert _check_links(raw) == 4  # the row, the other GPU's file, two concluded lines
    text = _labelled(raw)
    net = _section(text, report.SUITES["network"].title)
    assert "|resnet18|8|w1a2|exact|24|default|[0.250][network-20260103-000000]|" in net
    assert "alexnet" not in net and "[0.500]" not in net
    assert "Other GPUs' runs: NVIDIA Old GPU: [20260102-000000][network-20260102-000000]." in net
    assert "2 files of this suite: `nvidia-new-gpu/` 1, `nvidia-old-gpu/` 1." in net
    model = _section(text, report.SUITES["perfmodel"].title)
    assert "learned 11.4 (0.47)" in model and "Other GPUs" not in model
    assert "(folders under `results/`)" in text


def test_provenance_lines_leave_out_the_versions_stated_once():
    h100 = "Runs: NVIDIA H100 · driver 5 · torch 2.11 · CUDA 13.0 · 2026-01-02 · lowbit abc."
    lines = [h100, "x", h100.replace("01-02", "01-03"),
             "Runs: NVIDIA H100 · torch 2.10 · 2026-01-01.",  # other versions: kept
             "Runs: cpu · torch 2.13.0+cpu · 2026-01-04."]  # named once: kept
    assert report.shared_versions(lines) == [
        "Versions of the runs whose line names none: NVIDIA H100: driver 5, torch 2.11, "
        "CUDA 13.0.", "",
        "Runs: NVIDIA H100 · 2026-01-02 · lowbit abc.", "x",
        "Runs: NVIDIA H100 · 2026-01-03 · lowbit abc.", *lines[3:]]
    assert report.shared_versions(lines[3:]) == lines[3:]


def test_a_concluded_suite_whose_summary_fails_shows_its_tables(tmp_path):
    name, doc = SYNTHETIC["mma_ablation"][0]
    rows = [r for r in doc["rows"] if r["step"] != "default"]  # the summary needs the default
    results = _write(tmp_path, [(name, {**doc, "rows": rows})])
    section = _section(report.render(report.load(results, tmp_path)),
                       report.SUITES["mma_ablation"].title)
    assert "Concluded" not in section and "failed (" not in section
    assert "|resnet50_s3_3x3_b256|-|202.0 (3.95x)|" in section
