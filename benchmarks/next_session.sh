#!/usr/bin/env bash
# The next device session's first call (NOTES.md, "Next device session"): the GPU tests of the
# work not yet run on a GPU, the network rows and the probes that decide defaults, in priority
# order, inside one ~9.5-minute call:
#   bash benchmarks/next_session.sh; cd $OUT && tar czf logs.tgz logs && rm -rf logs
# The second call: benchmarks/next_session_b.sh (Nsight Compute, stem probe, tuning).
set -u
K='gpu_int32_to_float64 or gpu_templates_are_bit_exact or gpu_mobilenet_layers'
K+=' or gpu_mobilenet_dp4a or gpu_dp4a_small_cases or gpu_resnet50_narrow_block_end'
K+=' or gpu_resnet50_block_end_default_config or gpu_pass_resnet50_block_end'
K+=' or gpu_kernel_epilogue_requantizes or (small_cases and cuda)'
K+=' or (network_layers and grouped and w8a8_u8)'
K+=' or (executor_equals_reference and (mobilenet_v2 or mobilenet_v3_small or regnet_y or densenet or resnext or regnet_x or efficientnet_b0 or squeezenet or googlenet))'
K+=' or gpu_resnet_stem or gpu_gemm_kernel or one_integer_semantics or gpu_narrow_stream_networks'
K+=' or gpu_block_end_every or gpu_shared_workloads or (stem_ws and gpu_equals) or ws_stem'
K+=' or (squeeze_excite and cuda) or (channel_affine and cuda) or gpu_64_bit or gpu_guarded'
K+=' or gpu_resnet50_layer1_block_end or gpu_resnet_shapes'
# the conversion-free float64 epilogue runs in every int8 Triton kernel: its tests first;
# three workers (Triton / NVRTC builds are CPU-bound, the tests small)
export TESTS_A="-n 3 tests/test_float64_epilogue.py tests/test_shifted_bias.py tests/test_conv_pointwise.py tests/test_triton_depthwise.py tests/test_conv_outputs.py tests/test_pointwise_outputs.py tests/test_triton_netops_block_end.py tests/test_triton_netops.py tests/test_any_cnn_models.py tests/test_engine_gpu_cuda.py tests/test_stem.py tests/test_stem_derived.py tests/test_stem_ws.py tests/test_squeeze_excite.py tests/test_channel_affine.py tests/test_residual_stream.py tests/test_cuda_block_end.py tests/test_cuda_int8_wgmma.py -k '$K'"
export CASES="tv:mobilenet_v2:64:w8a8 tv:mobilenet_v2:64:w8a8:int8=-triton.conv2d_pointwise tv:mobilenet_v2:64:w8a8:int8=triton.conv2d_pointwise resnet50:256:w8a8:res8 resnet50:256:w8a8:res8:int8=-triton.conv2d_pointwise resnet50:256:w1a2:res8 resnet50:256:w1a2:res8:approx resnet50:256:w1a2:res8:sum64 tv:resnext50_32x4d:32:w2a2:res8 resnet18:8:w1a2:res8 tv:efficientnet_b0:64:w8a8 tv:densenet121:64:w8a8 tv:mobilenet_v3_large:64:w8a8 resnet50:256:w1a2:res8:stem=ws"
export COMPILE_MODELS="tv:mobilenet_v2 resnet50 tv:resnext50_32x4d tv:efficientnet_b0"
export PROBES="python3 benchmarks/probes/pointwise_probe.py --mobilenet; python3 benchmarks/probes/depthwise_probe.py --net mobilenet_v2 --batch 64 --quick --macs"
BUDGET_S=${BUDGET_S:-570} TESTS_A_S=${TESTS_A_S:-200} NETOPS_TESTS=0 TESTS_B_ON=0 BENCH_S=${BENCH_S:-250} \
  PROBE_S=${PROBE_S:-45} bash benchmarks/gpu_session.sh
