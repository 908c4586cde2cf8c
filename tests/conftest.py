"""Test session set-up: Triton runs in its interpreter when no CUDA GPU is present, tests
marked `gpu` are skipped there, the tuning records are a fresh file of the session's, and the
expensive parametrized tests are sampled for the CPU tier.

Tiers: README's test command runs `-m "not slow"` (the CPU tier, under 10 minutes on 2
cores); `-m slow` runs the rest (`benchmarks/gpu_session.sh`'s slow_tests step on the
device's 16 cores). Of each parametrized test in `SAMPLED` (its cases together took more
than 4 s on 2 CPU cores, pytest --durations, 2026-12-07) the CPU tier keeps every
`SAMPLE_EVERY`-th case in collection order (deterministic; the first case always); the
other cases are marked `slow`."""

import collections
import os
import tempfile
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
# the user's own tuning records never reach a test (lowbit.compile reads them by default)
os.environ["LOWBIT_RECORDS"] = str(Path(tempfile.mkdtemp(prefix="lowbit-test-")) /
                                   "records.sqlite")
if not HAS_CUDA:
    # must be set before triton is first imported (lowbit.kernels imports it lazily)
    os.environ.setdefault("TRITON_INTERPRET", "1")


#: parametrized tests sampled in the CPU tier (module docstring)
SAMPLED = frozenset({
    "tests/test_any_cnn_models.py::test_matrix_model_compiles_with_its_reasons",
    "tests/test_cuda_bitserial.py::test_space_constraints_hold",
    "tests/test_cuda_bitserial_emu.py::test_emulated_chained_kernel_is_bit_exact",
    "tests/test_cuda_bitserial_emu.py::test_emulated_kernel_is_bit_exact",
    "tests/test_cuda_bitserial_emu.py::test_emulation_catches_crossed_output_pairs",
    "tests/test_cuda_bitserial_emu.py::test_emulation_catches_input_read_before_the_wait",
    "tests/test_cuda_block_end.py::test_block_end_compiles_with_nvrtc_slow",
    "tests/test_cuda_mma_conv.py::test_default_config_is_in_every_space",
    "tests/test_cuda_tap_shift.py::test_emulated_tap_shift_is_bit_exact",
    "tests/test_engine_gpu.py::test_pooled_layers_requantize_in_the_kernel_then_pool",
    "tests/test_engine_gpu.py::test_zoo_plans_bit_exact",
    "tests/test_engine_reference.py::test_non_224_input_and_odd_batch",
    "tests/test_engine_reference.py::test_zoo_plan_matches_convert",
    "tests/test_gemv.py::test_conv_every_epilogue_with_split_k",
    "tests/test_gemv.py::test_conv_shapes_at_the_default_and_a_split_config",
    "tests/test_gemv.py::test_odd_shapes_at_the_default_and_a_split_config",
    "tests/test_gemv.py::test_u8_activations_are_exact",
    "tests/test_gemv.py::test_u8_conv_with_padding_is_exact",
    "tests/test_residual_epilogue.py::test_emulation_catches_a_broken_residual_epilogue",
    "tests/test_residual_stream.py::test_plan_realizes_the_narrow_stream_exactly",
    "tests/test_shifted_bias.py::test_emulated_bitserial_kernels_are_bit_exact",
    "tests/test_shifted_bias.py::test_interpreted_triton_float64_requantization_is_bit_exact",
    "tests/test_shifted_bias.py::test_interpreted_triton_templates_are_bit_exact",
    "tests/test_stem.py::test_gemm_kernel_matches_reference",
    "tests/test_stem.py::test_stem_configs",
    "tests/test_stem_derived.py::test_resnet_stem_derived_outputs",
    "tests/test_triton_depthwise.py::test_depthwise_bit_exact",
    "tests/test_triton_depthwise.py::test_depthwise_dp4a_bit_exact",
    "tests/test_triton_depthwise.py::test_grouped_bit_exact",
    "tests/test_triton_igemm.py::test_conv_epilogues_stride2",
    "tests/test_triton_igemm.py::test_conv_packed_inputs",
    "tests/test_triton_igemm.py::test_conv_split_k_crs",
    "tests/test_triton_igemm.py::test_gemm_epilogues_split_k",
    "tests/test_triton_igemm.py::test_gemm_split_k_summed_by_the_last_program",
    "tests/test_triton_igemm.py::test_row_taps_loop_order",
    "tests/test_triton_igemm.py::test_u8_activations_take_a_zero_point",
    "tests/test_triton_netops.py::test_avgpool",
    "tests/test_triton_netops.py::test_global_avgpool",
    "tests/test_triton_netops.py::test_layer_epilogue_outputs",
    "tests/test_triton_netops.py::test_maxpool",
    "tests/test_triton_netops_block_end.py::test_kernel_epilogue_requantizes_in_int32",
    "tests/test_triton_netops_block_end.py::test_pass_block_end_outputs",
    "tests/test_triton_sm90_compile.py::test_compiles_for_sm90_with_wgmma",
    "tests/test_triton_tma_conv.py::test_epilogues",
    "tests/test_triton_tma_conv.py::test_shapes_and_padding",
    "tests/test_triton_tma_conv.py::test_split_k_epilogues",
    "tests/test_triton_tma_conv.py::test_tile_shapes",
    "tests/test_triton_tma_conv.py::test_u8_activations_take_a_zero_point",
})
SAMPLE_EVERY = 4


def sample_cases(items: list) -> int:
    """Mark `slow` all but every SAMPLE_EVERY-th case of the SAMPLED tests; returns how many
    cases were marked."""
    seen: collections.Counter = collections.Counter()
    marked = 0
    for item in items:
        base, _, params = item.nodeid.partition("[")
        if params and base in SAMPLED:
            if seen[base] % SAMPLE_EVERY:
                item.add_marker(pytest.mark.slow)
                marked += 1
            seen[base] += 1
    return marked


def pytest_collection_modifyitems(config, items):
    sample_cases(items)
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
