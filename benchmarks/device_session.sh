#!/usr/bin/env bash
# One device call: the GPU tests, then the benchmark steps named on the command line. Results
# JSON lands in $OUT (benchmarks/common.py writes results into $LOWBIT_RESULTS_DIR), among them
# gpu_tests-*.json, the test steps' counts from their JUnit files
# (benchmarks/gpu_tests_summary.py); logs and JUnit files go to $OUT/logs/, which stays out of
# the tree. Steps run in the order given, each under its own time limit, and a failing step
# does not stop the next one.
#
#   bash benchmarks/device_session.sh tests gemm                 # one call of <= 10 min
#
# Keep the limits of one call's steps under the device's 600 s per command (LIMIT_<step>=s
# overrides one), e.g. the calls (LIMIT_tests=190 LIMIT_tests_cuda=370: tests tests_cuda),
# (bitserial_ab), (tune_b16), (conv_b16 conv_b256), (bitserial_tuned_a). A call's
# timed-*.json come back with its results: commit them under benchmarks/results/<gpu>/ and the
# conv steps of later calls re-time their configs too.
#
# Steps (seconds are the limits, sized for an H100 and a warm Triton cache):
#   tests        pytest -m gpu over the Triton kernels and the tuner              (240)
#   tests_cuda   pytest -m gpu over the CUDA bit-serial and mma.sync kernels       (540)
#   tests_bitserial  the same, only the bit-serial families and cuda.int8_wgmma (their
#                tap-shift tests included)                                          (540)
#   gemm         benchmarks/gemm.py, whole space of the FC shapes                  (300)
#   conv_b16     benchmarks/conv.py on ResNet-50 3x3 at batch 16                   (300)
#   conv_b256    benchmarks/conv.py on ResNet-50 3x3 at batch 256                  (420)
#                (both add the tuned bests of the timed-*.json in $OUT and in
#                 benchmarks/results/<this gpu>/)
#   conv_r18     benchmarks/conv.py on the ResNet-18 batch-8 layers (stride 2 by TMA) (300)
#   conv_other   benchmarks/conv.py on the ResNet-50 1x1, APNN-TC sweep and TVM layers   (300)
#   tune_b16     benchmarks/tuning.py timed, both int8 templates, batch-16 layers  (420)
#   tune_wgmma8  the same at batch 256 with cuda.int8_wgmma (s8 wgmma, one batch in
#                flight) against the TMA template                                   (540)
#   bitserial    benchmarks/bitserial.py at w1a4, w2a4, w3a3                       (420)
#   (Nsight Compute profiles of bit-serial rows: benchmarks/ncu_bitserial.sh, its own call)
#   bitserial_tuned_a / _b   w1a1 and w1a2 rows tuned first (lowbit.tune, 45 s each) against
#                the tuned int8 configs of the committed timed-*.json: GEMM 4096^3 + ResNet-50
#                s2/s3 at batch 256 (a), s4/s5 (b), the APNN-TC conv + fc_b128 (small)
#                                                                                   (590 each)
#   tests_split  the split-K GPU tests only                                       (120)
#   bitserial_small  w1a1/w1a2 on grids of few tiles, where split-K applies: the APNN-TC conv
#                (b1, 16x16, C=K=1024) and fc_b128 (SMALL_LAYERS=a,b overrides); candidates
#                with their SPLIT_K twins + the committed rows' 3 best           (300)
#   tests_shift  pytest -m gpu over the tap-shift wgmma conv (cuda.bitserial_tap_shift)  (300)
#   bitserial_shift  w1a1/w1a2 ResNet-50 s2-s5 b256 (SHIFT_LAYERS=a,b overrides): candidates
#                with every tap-shift tile shape + the committed rows' 3 best       (540)
#   bitserial_tuned_shift  w1a1/w1a2 rows tuned over the space with TAP_SHIFT (SHIFT_LAYERS=a,b;
#                default the ResNet-50 b256 3x3 layers)                               (590)
#   cut_probe    benchmarks/probes/cut_probe.py: bit-serial kernels timed whole and with their
#                MMAs, epilogue or stage loads cut out through the templates' cut points, and
#                an empty kernel of their launch (PROBE_ROWS="workload:precision[:template] ..."
#                overrides the rows; PROBE_VARIANTS="base mma ..." the variants)   (240)
#   bitserial_focus  w1a1/w1a2 rows (FOCUS_LAYERS=a,b; default GEMM 4096, ResNet-50 s2-s5 b256,
#                the APNN-TC conv): the default config and the FOCUS_CONFIGS (2) fastest committed
#                ones per row, with their ROWSUM / REQUANT / ROW_TABLE twins, and the configs
#                of EXTRA_CONFIGS (a JSON list, bitserial.py --extra-configs)          (540)
#   tests_chained  pytest -m gpu over the chained (PDL) layer tests and the in-place kernels (150)
#   layer_chain  benchmarks/layer_chain.py: bit-serial layers in x -> y -> x pairs, plain and
#                chained by programmatic dependent launch, against cuDNN fp16 pairs (CHAIN_LAYERS=a,b
#                overrides the layers)                                              (300)
#   bitserial_ab w1a1/w1a2 GEMM 4096^3 + ResNet-50 s2-s5 b256 (AB_LAYERS=a,b overrides), no
#                tuning: the hand candidates
#                (with REQUANT / ROWSUM twins) and the committed rows' 3 best configs with
#                theirs, against the tuned int8 configs                            (590)
# Wheels the image lacks (xgboost-cpu, optuna and its needs) travel in .whl/ (device README).
set -u -o pipefail
: "${OUT:?OUT must name the results folder}"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD/src
else
    export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1 LOWBIT_RESULTS_DIR=$OUT
LOGS=$OUT/logs
mkdir -p "$LOGS"
# the device's copy of .git can be stale: pass LOWBIT_GIT_SHA from the calling machine
export LOWBIT_GIT_SHA=${LOWBIT_GIT_SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"

step() {  # step NAME LIMIT_S COMMAND...  (LIMIT_<NAME>=seconds overrides the limit)
    local name=$1 limit=$2 override="LIMIT_$1"
    limit=${!override:-$limit}
    shift 2
    echo "=== $name (limit ${limit}s) $(date -u +%T)"
    timeout -s INT -k 20 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
    echo "=== $name rc=$? $(date -u +%T)"
}

GPU_DIR=benchmarks/results/$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null \
    | head -1 | tr 'A-Z ' 'a-z-')
timed_files() {  # tuned configs, and the winners of the committed conv runs of 2026-11-23 on
    compgen -G "$OUT/timed-*.json"; compgen -G "$GPU_DIR/timed-*.json"
    compgen -G "$GPU_DIR/conv-2026112[3-9]-*.json"; true
}

INT8_TIMED=$(compgen -G "benchmarks/results/nvidia-h100-80gb-hbm3/timed-2026112[3-9]-*.json")
bitserial_tuned() {  # bitserial_tuned SUFFIX LAYERS
    local limit_var="LIMIT_bitserial_tuned_$1"
    local limit=${!limit_var:-590}
    step "bitserial_tuned_$1" "$limit" python3 benchmarks/bitserial.py --layers "$2" \
        --precisions w1a1,w1a2 --tune-trials 160 --tune-budget-s 45 \
        --budget-s $(( limit - 50 )) \
        --partial "$OUT/bitserial-tuned-$1-partial.json" --int8-timed $INT8_TIMED
}

bitserial_rows() {  # bitserial_rows SUFFIX LIMIT TRIES LAYERS: w1a1/w1a2 rows (PRECISIONS=w1a2
    # overrides), no tuning, with
    # the committed rows' 3 best configs (and twins) beside the candidates
    local limit_var="LIMIT_bitserial_$1"
    local limit=${!limit_var:-$2}
    step "bitserial_$1" "$limit" python3 benchmarks/bitserial.py --tries "$3" --layers "$4" \
        --precisions "${PRECISIONS:-w1a1,w1a2}" --budget-s $(( limit - 45 )) \
        --partial "$OUT/bitserial-$1-partial.json" \
        --configs $(compgen -G "$GPU_DIR/bitserial-2026112[3-9]-*.json") \
        --int8-timed $INT8_TIMED
}

TRITON_TESTS="tests/test_triton_igemm.py tests/test_triton_tma_conv.py tests/test_tune_gpu.py"
CUDA_TESTS="tests/test_cuda_bitserial.py tests/test_cuda_tap_shift.py tests/test_cuda_int8_wgmma.py
    tests/test_cuda_mma_conv.py tests/test_cuda_nvrtc.py"
B16=resnet50_s2_3x3,resnet50_s3_3x3,resnet50_s4_3x3,resnet50_s5_3x3
B256=resnet50_s2_3x3_b256,resnet50_s3_3x3_b256,resnet50_s4_3x3_b256,resnet50_s5_3x3_b256
for s in "$@"; do
    case $s in
    tests) step tests 240 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider \
        --junitxml="$LOGS/tests.xml" $TRITON_TESTS ;;
    tests_cuda) step tests_cuda 540 python3 -m pytest -q -m gpu -n 14 -p no:cacheprovider \
        --junitxml="$LOGS/tests_cuda.xml" $CUDA_TESTS ;;
    tests_bitserial) step tests_bitserial 540 python3 -m pytest -q -m gpu -n 14 -p no:cacheprovider \
        --junitxml="$LOGS/tests_bitserial.xml" tests/test_cuda_bitserial.py \
        tests/test_cuda_tap_shift.py tests/test_cuda_int8_wgmma.py ;;
    gemm) step gemm 300 python3 benchmarks/gemm.py --whole-space-below 1000 ;;
    conv_b16) step conv_b16 300 python3 benchmarks/conv.py --suites resnet50_3x3_b16 \
        --max-configs 24 --budget-s 240 --timed $(timed_files) ;;
    conv_b256) step conv_b256 420 python3 benchmarks/conv.py --suites resnet50_3x3_b256 \
        --max-configs 24 --budget-s 360 --timed $(timed_files) ;;
    conv_other) step conv_other 300 python3 benchmarks/conv.py \
        --suites resnet50_1x1,apconv_sweep,tvm_tutorial --max-configs 24 --budget-s 240 \
        --timed $(timed_files) ;;
    conv_r18) step conv_r18 300 python3 benchmarks/conv.py --suites resnet18_b8 \
        --max-configs 24 --budget-s 240 --timed $(timed_files) ;;
    tune_wgmma8) step tune_wgmma8 540 python3 benchmarks/tuning.py timed --layers "$B256" \
        --trials 160 --budget-s 500 --templates triton.conv2d_int8_tma,cuda.int8_wgmma ;;
    tune_b16) step tune_b16 420 python3 benchmarks/tuning.py timed --layers "$B16" \
        --trials 300 --budget-s 380 \
        --templates triton.conv2d_int8,triton.conv2d_int8_tma ;;
    bitserial) step bitserial 420 python3 benchmarks/bitserial.py \
        --precisions w1a4,w2a4,w3a3 --budget-s 380 --partial "$OUT/bitserial-partial.json" ;;
    bitserial_tuned_a) bitserial_tuned a gemm_4096,resnet50_s2_3x3_b256,resnet50_s3_3x3_b256 ;;
    bitserial_tuned_b) bitserial_tuned b resnet50_s4_3x3_b256,resnet50_s5_3x3_b256 ;;
    bitserial_tuned_small) bitserial_tuned small apconv_b1_c1024,fc_b128_4096to4096 ;;
    bitserial_tuned_shift) bitserial_tuned shift "${SHIFT_LAYERS:-$B256}" ;;
    tests_split) step tests_split 120 python3 -m pytest -q -m gpu -p no:cacheprovider \
        --junitxml="$LOGS/tests_split.xml" -k split tests/test_cuda_bitserial.py ;;
    bitserial_small) bitserial_rows small 300 3 \
        "${SMALL_LAYERS:-apconv_b1_c1024,fc_b128_4096to4096}" ;;
    bitserial_ab) bitserial_rows ab 590 1 "${AB_LAYERS:-gemm_4096,$B256}" ;;
    bitserial_focus) step bitserial_focus "${LIMIT_bitserial_focus:-540}" python3 \
        benchmarks/bitserial.py --focus --configs-per-row "${FOCUS_CONFIGS:-2}" \
        --layers "${FOCUS_LAYERS:-gemm_4096,$B256,apconv_b1_c1024}" \
        --precisions "${PRECISIONS:-w1a1,w1a2}" \
        --budget-s $(( ${LIMIT_bitserial_focus:-540} - 45 )) \
        --partial "$OUT/bitserial-focus-partial.json" \
        --configs $(compgen -G "$GPU_DIR/bitserial-2026112[3-9]-*.json") \
        ${EXTRA_CONFIGS:+--extra-configs "$EXTRA_CONFIGS"} --int8-timed $INT8_TIMED ;;
    tests_shift) step tests_shift 300 python3 -m pytest -q -m gpu -n 14 -p no:cacheprovider \
        --junitxml="$LOGS/tests_shift.xml" tests/test_cuda_tap_shift.py ;;
    bitserial_shift) bitserial_rows shift 540 1 "${SHIFT_LAYERS:-$B256}" ;;
    cut_probe) step cut_probe 240 python3 benchmarks/probes/cut_probe.py \
        ${PROBE_ROWS:+--rows $PROBE_ROWS} ${PROBE_VARIANTS:+--variants $PROBE_VARIANTS} ;;
    tests_chained) step tests_chained 150 python3 -m pytest -q -m gpu -n 8 -p no:cacheprovider \
        --junitxml="$LOGS/tests_chained.xml" -k "chained or a_in_halo or tma_halo" \
        tests/test_cuda_bitserial.py ;;
    layer_chain) step layer_chain 300 python3 benchmarks/layer_chain.py \
        ${CHAIN_LAYERS:+--layers $CHAIN_LAYERS} ;;
    *) echo "unknown step $s" >&2 ;;
    esac
done
# the test steps' counts as a results file for the tree
if compgen -G "$LOGS/*.xml" >/dev/null; then
    python3 benchmarks/gpu_tests_summary.py "$LOGS"/*.xml --out "$OUT"
fi
