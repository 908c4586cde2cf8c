#!/usr/bin/env bash
# One device call for the GPU executor (issue 32), <= 6 minutes on an H100 with cold Triton /
# NVRTC caches. Steps in priority order, each under `timeout` and within what is left of the
# budget (BUDGET_S, default 345 s); a failing or cut step does not stop the next, and
# network.py rewrites its results file after every case, so a cut run keeps its rows.
#   1. tests_a   pytest -m gpu: ResNet-18 w1a2 b8 (every tensor bit-exact under graph replay),
#                the non-finite check, then the netops / stem GPU tests
#   2. bench     benchmarks/network.py: resnet18 b8 w1a2, resnet50 b256 w1a2 and w8a8, vgg16 b8
#                w1a2, alexnet b8 w1a2 (the b8 rows also check logits against the reference),
#                then resnet18 b8 w8a8 and resnet50 b256 w8a8 with the int8 layers' epilogue in
#                the separate pass (the fused outputs' same-run baseline); the torch.compile baseline (mode
#                "default", not the issue's "max-autotune", which compiles for minutes) for
#                ResNet-50 b256 only, measured after every case
#   3. tests_b   the other engine GPU tests (VGG-16, AlexNet, ResNet-50, chained layers, fp16
#                layers, the int8 kernels' fused layer epilogue, ...) with the time left
# Env: SLOW_TESTS=1 runs the CPU suite's slow tier too (after tests_b); BUDGET_S, BENCH_S (the bench step's limit, default 230), NETOPS_TESTS=0 / TESTS_B_ON=0 skip those steps, CASES="model:batch:precision ..."
# and COMPILE_MODE (default "default"; "none" skips torch.compile) pick the benchmark rows.
# Outputs under $OUT: the results files to commit under benchmarks/results/<gpu>/ --
# network-*.json, network-*.png and gpu_tests-*.json (the pytest runs' counts, from their JUnit
# XML, benchmarks/gpu_tests_summary.py) -- and, not for the tree, logs/: summary.txt (steps,
# exit codes, seconds, environment), tests_a.log, bench.log, tests_b.log and the JUnit files.
set -u
OUT=${OUT:-/tmp/lowbit-out}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
START=$(date +%s)
BUDGET_S=${BUDGET_S:-345}
SUMMARY="$LOGS/summary.txt"

elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( BUDGET_S - $(elapsed) )); }

{
  echo "start $(date -u +%FT%TZ)"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl 2>&1 | tail -3 || echo "wheel install failed"
} >> "$SUMMARY" 2>&1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests
export PYTHONDONTWRITEBYTECODE=1
export LOWBIT_RESULTS_DIR="$OUT"

python3 - >> "$SUMMARY" 2>&1 <<'EOF'
import importlib
for mod in ("torch", "triton", "pytest", "hypothesis", "matplotlib", "cuda.bindings",
            "safetensors", "typer", "rich", "optuna", "xgboost"):
    try:
        m = importlib.import_module(mod)
        print(f"{mod} {getattr(m, '__version__', 'ok')}")
    except Exception as e:
        print(f"MISSING {mod}: {type(e).__name__}: {e}")
import torch
print("gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else "NONE")
EOF
echo "setup done at $(elapsed)s" >> "$SUMMARY"

# step NAME LIMIT_S RESERVE_S CMD...: run CMD under min(LIMIT_S, time left - RESERVE_S), log to
# $LOGS/NAME.log
step() {
  local name=$1 limit=$2 reserve=$3
  shift 3
  local budget=$(( $(left) - reserve ))
  (( budget < limit )) && limit=$budget
  if (( limit < 20 )); then
    echo "$name skipped (no time left) at $(elapsed)s" >> "$SUMMARY"
    return
  fi
  local t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >> "$LOGS/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc ($( [ $rc = 124 ] && echo "cut at ${limit}s" || echo ok)) $(( $(date +%s) - t0 ))s, at $(elapsed)s" >> "$SUMMARY"
}

PYTEST="python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs"
# junit_pytest NAME: the pytest command line of step NAME, its JUnit XML into $LOGS/NAME.xml
junit_pytest() { echo "$PYTEST --junitxml=$LOGS/$1.xml"; }
# TESTS_A / TESTS_B: pytest arguments of the two test steps (default: the engine's); CASES and
# COMPILE_MODE: the network rows and their torch.compile baseline ('none'); PROBES: probe
# commands separated by ';' (each writes its JSON into $OUT), run after the benchmark
TESTS_A=${TESTS_A:-'tests/test_engine_gpu_cuda.py -k "resnet18-w1a2-b8 or nonfinite"'}
step tests_a "${TESTS_A_S:-110}" 200 bash -c "$(junit_pytest tests_a) $TESTS_A"
[ "${NETOPS_TESTS:-1}" = 1 ] && step tests_a 45 155 $(junit_pytest tests_a_netops) \
  tests/test_triton_netops.py tests/test_stem.py
step bench "${BENCH_S:-230}" 10 python3 benchmarks/network.py --out "$OUT" --quick \
  --cases ${CASES:-resnet18:8:w1a2 resnet50:256:w1a2 resnet50:256:w8a8 vgg16:8:w1a2 alexnet:8:w1a2 resnet18:8:w8a8 resnet50:256:w8a8:nofuse} \
  --compile-mode "${COMPILE_MODE:-default}" --compile-models ${COMPILE_MODELS:-resnet50}
i=0
IFS=';' read -ra probe_cmds <<< "${PROBES:-}"
for cmd in "${probe_cmds[@]}"; do
  [ -z "${cmd// }" ] && continue
  i=$((i + 1))
  step "probe$i" "${PROBE_S:-90}" 10 bash -c "$cmd"
done
TESTS_B=${TESTS_B:-'tests/test_engine_gpu_cuda.py tests/test_conv_outputs.py -k "not (resnet18-w1a2-b8 and bit_exact) and not nonfinite"'}
[ "${TESTS_B_ON:-1}" = 1 ] && step tests_b "${TESTS_B_S:-200}" 5 \
  bash -c "$(junit_pytest tests_b) $TESTS_B"
# the CPU suite's slow tier (README: the CPU tier runs -m "not slow") on the device's cores
[ "${SLOW_TESTS:-0}" = 1 ] && step slow_tests "${SLOW_TESTS_S:-240}" 5 bash -c \
  "python3 -m pytest -q -p no:cacheprovider -m 'slow and not gpu' \
   \$(python3 -c 'import xdist' 2>/dev/null && echo '-n 16') --junitxml=$LOGS/slow_tests.xml"
# the tests' counts as a results file for the tree (the logs stay in $LOGS)
compgen -G "$LOGS/*.xml" > /dev/null && python3 benchmarks/gpu_tests_summary.py "$LOGS"/*.xml \
  --out "$OUT" >> "$SUMMARY" 2>&1
echo "end at $(elapsed)s" >> "$SUMMARY"
tail -40 "$LOGS/bench.log" >> "$SUMMARY" 2>/dev/null
exit 0
