#!/usr/bin/env bash
# The next device call (NOTES.md, "Next device session"): every GPU test and benchmark of the
# work not yet run on a GPU, in priority order, inside one ~9-minute call:
#   bash benchmarks/next_session.sh; cd $OUT && tar czf logs.tgz logs && rm -rf logs
set -u
K='(small_cases and cuda) or (network_layers and grouped and w8a8_u8)'
K+=' or (executor_equals_reference and (mobilenet_v2 or mobilenet_v3_small or regnet_y or densenet or resnext or regnet_x or efficientnet_b0 or squeezenet or googlenet))'
K+=' or gpu_resnet_stem or gpu_gemm_kernel or one_integer_semantics or gpu_narrow_stream_networks'
K+=' or gpu_block_end_every or gpu_shared_workloads or (stem_ws and gpu_equals) or ws_stem'
K+=' or (squeeze_excite and cuda) or (channel_affine and cuda) or gpu_64_bit or gpu_guarded'
K+=' or gpu_mobilenet_layers'
export TESTS_A="tests/test_conv_pointwise.py tests/test_triton_depthwise.py tests/test_any_cnn_models.py tests/test_stem.py tests/test_stem_derived.py tests/test_stem_ws.py tests/test_squeeze_excite.py tests/test_channel_affine.py tests/test_engine_gpu_cuda.py tests/test_residual_stream.py tests/test_cuda_block_end.py tests/test_cuda_int8_wgmma.py -k '$K'"
export CASES="resnet50:256:w1a2:res8 resnet50:256:w1a2:res8:sum64 resnet50:256:w1a2:res8:stem=ws tv:resnext50_32x4d:32:w2a2:res8 tv:mobilenet_v2:64:w8a8 tv:mobilenet_v2:64:w8a8:int8=-triton.conv2d_pointwise tv:mobilenet_v2:64:w8a8:int8=triton.conv2d_int8 tv:mobilenet_v2:64:w8a8:int8=cuda.int8_wgmma resnet18:8:w1a2:res8 resnet18:8:w1a2:res8:stem=ws resnet50:256:w8a8:res8 tv:densenet121:64:w8a8 tv:mobilenet_v3_large:64:w8a8 resnet50:256:w1a2:res8:approx"
export COMPILE_MODELS="tv:resnext50_32x4d tv:mobilenet_v2 resnet50"
export PROBES="python3 benchmarks/probes/stem_probe.py --out \$OUT --outputs u8 u2@u8 --variants ws 'ws band /2' 'ws band 8'; python3 benchmarks/probes/depthwise_probe.py --net resnext50_32x4d resnext50_32x4d_cuda --precisions w2a2_net --batch 32; python3 benchmarks/probes/pointwise_probe.py --mobilenet"
BUDGET_S=${BUDGET_S:-570} TESTS_A_S=${TESTS_A_S:-210} NETOPS_TESTS=0 TESTS_B_ON=0 BENCH_S=${BENCH_S:-220} \
  PROBE_S=${PROBE_S:-40} bash benchmarks/gpu_session.sh
