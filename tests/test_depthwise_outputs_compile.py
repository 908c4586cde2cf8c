"""The depthwise kernel's fused layer outputs (`depthwise_outputs`) compile for sm_90 on the
template's default configs without spill: EfficientNet-B0's depthwise layers at batch 64
(3x3 and 5x5, stride 1 and 2, 32 to 1,152 channels), each with a SiLU table over the s8 mid
value into s16 beside that s8 value stored (the network's two outputs, one formula), or
beside a requantized s8 output of its own formula, and with one plain requantized output, in
at most 168 registers (three programs of 128 threads a SM). Offline: `run_module_report`
compiles them in a fresh Python without TRITON_INTERPRET (the Triton installed; the device
runs 3.6: 138-168 registers there, 72-146 on 3.9).
"""

from __future__ import annotations

import json
import os

import pytest
import triton

from triton_offline import run_module_report

#: register / spill checks (ptxas, several seconds each): the slow tier
pytestmark = pytest.mark.slow

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
#: name: (H, C, R, stride, output kinds), all at batch 64, s8 activations
CASES = {
    "f1_112x32_3x3": (112, 32, 3, 1, ("silu_s16", "mid")),
    "f2_112x96_3x3_s2": (112, 96, 3, 2, ("silu_s16", "mid")),
    "f2_56x144_3x3": (56, 144, 3, 1, ("silu_s16", "mid")),
    "f3_56x144_5x5_s2": (56, 144, 5, 2, ("silu_s16", "mid")),
    "f3_28x240_5x5": (28, 240, 5, 1, ("silu_s16", "mid")),
    "f4_14x480_3x3": (14, 480, 3, 1, ("silu_s16", "mid")),
    "f6_7x1152_5x5": (7, 1152, 5, 1, ("silu_s16", "mid")),
    "f2_56x144_3x3_two": (56, 144, 3, 1, ("silu_s8", "s8")),
    "f3_28x240_5x5_two": (28, 240, 5, 1, ("silu_s8", "s8")),
    "f2_56x144_3x3_plain": (56, 144, 3, 1, ("s8",)),
    "f3_28x240_5x5_plain": (28, 240, 5, 1, ("s8",)),
}


def _launchers() -> dict:
    """name -> Launcher of the default depthwise config, bound on CPU tensors (device checks
    off; nothing launched)."""
    import torch

    from depthwise_outputs_cases import layer_specs
    from lowbit.core import ConvWorkload, Epilogue, Layout
    from lowbit.core.validate import operand_shapes
    from lowbit.kernels import get_template, load_backends
    from lowbit.kernels.base import acc_bound
    from lowbit.kernels.triton import netops as K
    from lowbit.kernels.triton import stored, templates
    from lowbit.kernels.triton.conv_outputs import bind_conv_outputs
    from lowbit.reference import random_inputs

    templates.interpreting = stored.interpreting = lambda: True
    load_backends()
    depthwise = get_template("triton.conv2d_depthwise")
    out = {}
    for name, (h, c, r, stride, kinds) in CASES.items():
        wl = ConvWorkload(N=64, H=h, W=h, C=c, K=c, R=r, S=r, stride=stride, pad=r // 2,
                          groups=c, epilogue=Epilogue())
        xs, ws, shape = (tuple(s) for s in operand_shapes(wl))
        params = random_inputs(wl.replace(N=1, H=r, W=r), seed=1, device="cpu")[2]
        specs = layer_specs(kinds, c, acc_bound(wl) // 8)
        outs = [K.empty_packed(shape, sp.precision, Layout.INT8, "cpu") for sp in specs]
        out[name] = bind_conv_outputs(
            depthwise.build(wl, depthwise.default_config(wl)),
            torch.zeros(xs, dtype=torch.int8), torch.zeros(ws, dtype=torch.int8), params,
            specs, outs)
    return out


@pytest.fixture(scope="module")
def report() -> dict:
    if not os.path.isdir(BIN):
        pytest.skip("this Triton has no bundled NVIDIA tools (ptxas)")
    return run_module_report(__file__)


def test_fused_outputs_compile_without_spill(report):
    failed = {k: v for k, v in report.items() if not isinstance(v, list)}
    assert not failed, failed
    assert sorted(report) == sorted(CASES)
    rows = {k: r for k, (r,) in report.items()}
    assert {r["kernel"] for r in rows.values()} == {"depthwise_outputs_kernel"}
    assert all(r["spill_bytes"] == 0 for r in rows.values()), rows
    # at most 168 registers: three programs of 128 threads a SM
    assert all(r["regs"] <= 168 for r in rows.values()), rows


if __name__ == "__main__":
    from triton_offline import launcher_report

    print(json.dumps(launcher_report(_launchers())))
