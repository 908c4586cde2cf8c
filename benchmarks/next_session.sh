#!/usr/bin/env bash
# The next device session's first call (NOTES.md, "Next device session"), ~9.5 minutes:
#   bash benchmarks/next_session.sh; cd $OUT && tar czf logs.tgz logs && rm -rf logs
# 1. the GPU tests the last two broad runs failed 3 of (unnamed): one process, names printed
# 2. the network rows that decide the eighth session's defaults
# 3. ResNet-18 b8 w1a2 tuned (default / tuned / model plans timed in one process)
# The second call: benchmarks/next_session_b.sh (Nsight Compute, the ResNet-50 tune).
set -u
K='gpu_resnet50_block_end_default_config or gpu_int32_to_float64'
K+=' or (executor_equals_reference and (efficientnet_b0 or mobilenet_v3_small))'
K+=' or one_integer_semantics or gpu_narrow_resnet18_on_the_ws_stem'
export TESTS_A="-vv -rfE --tb=short tests/test_conv_outputs.py tests/test_float64_epilogue.py tests/test_any_cnn_models.py tests/test_engine_gpu_cuda.py tests/test_stem_derived.py -k '$K'"
export CASES="resnet50:256:w1a2:res8 resnet50:256:w1a2:res8:stem=bands tv:efficientnet_b0:64:w8a8 tv:mobilenet_v3_large:64:w8a8 tv:mobilenet_v2:64:w8a8 resnet18:8:w1a2:res8 resnet18:8:w1a2:res8:stem=bands"
export COMPILE_MODELS="tv:efficientnet_b0 tv:mobilenet_v3_large"
export PROBES="python3 benchmarks/tune_network.py --model resnet18 --batch 8 --precision w1a2 --residual-bits 8 --budget 200 --out \$OUT"
BUDGET_S=${BUDGET_S:-570} TESTS_A_S=${TESTS_A_S:-150} NETOPS_TESTS=0 TESTS_B_ON=0 \
  BENCH_S=${BENCH_S:-200} PROBE_S=${PROBE_S:-200} bash benchmarks/gpu_session.sh
