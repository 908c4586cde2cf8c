"""The implicit GEMM's fused layer outputs (`conv_outputs`, `igemm_outputs_kernel`) compile for
sm_90 on ResNet-50 w8a8 batch-256 block ends (an 8-bit residual into the stored u8 mid, a wide
float64 requantization: FAST_NARROW or FAST_NARROW_CVT) on the default fused tile without
spill, against whatever Triton is installed, in the form
`epilogue.CONVERSION_FREE_FUSED_OUTPUTS` picks: no float64 conversion where it is
conversion-free, at most 112 registers where it converts (nine programs of 64 threads a SM;
the conversion-free form took 126-132 on Triton 3.6). Offline: `run_module_report` compiles
them in a fresh Python without TRITON_INTERPRET.
"""

from __future__ import annotations

import json

import pytest

from test_pointwise_outputs_compile import block_end_launchers
from triton_offline import module_report_or_skip, one_launch_rows

#: register / spill checks (ptxas, several seconds each): the slow tier
pytestmark = pytest.mark.slow

#: name: (N, H, C, K, residual, kinds, int32, (mid, relu)): the layer2 / layer3 block ends
#: (first block: the downsampling shortcut's s8; later ones: the u8 stream)
CASES = {
    "r50_layer2_0_conv3": (256, 28, 128, 512, "s8", ("mid",), False, ("u8", True)),
    "r50_layer2_1_conv3": (256, 28, 128, 512, "u8", ("mid",), False, ("u8", True)),
    "r50_layer3_0_conv3": (256, 14, 256, 1024, "s8", ("mid",), False, ("u8", True)),
}
TEMPLATE = "triton.conv2d_int8"


@pytest.fixture(scope="module")
def report() -> dict:
    return module_report_or_skip(__file__)


def test_block_end_outputs_compile_without_spill(report):
    from lowbit.kernels.triton.epilogue import CONVERSION_FREE_FUSED_OUTPUTS

    rows = one_launch_rows(report, CASES, "igemm_outputs_kernel")
    if CONVERSION_FREE_FUSED_OUTPUTS:
        assert all(r["cvt_f64"] == 0 for r in rows.values()), rows
    else:
        assert all(r["cvt_f64"] > 0 and r["regs"] <= 112 for r in rows.values()), rows


def test_block_ends_take_the_wide_float64_form():
    """The cases requantize in the mode the constant picks (not INT32 or FAST)."""
    from lowbit.kernels.triton import layer_outputs as L
    from lowbit.kernels.triton.epilogue import CONVERSION_FREE_FUSED_OUTPUTS

    want = L.FAST_NARROW if CONVERSION_FREE_FUSED_OUTPUTS else L.FAST_NARROW_CVT
    modes = {name: launcher.launches[0].kwargs["MODE0"]
             for name, launcher in block_end_launchers(TEMPLATE, CASES).items()}
    assert modes == dict.fromkeys(CASES, want)


if __name__ == "__main__":
    from triton_offline import launcher_report

    print(json.dumps(launcher_report(block_end_launchers(TEMPLATE, CASES))))
