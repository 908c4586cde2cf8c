"""The persistent pointwise kernel's fused layer outputs (`pointwise_outputs`) compile for sm_90
on the default outputs tile without spill, their float64 requantization converting nothing
(`triton_offline.cvt_f64`): ResNet-50's layer1 block end (C=64 -> K=256 at 56x56) with a u8
residual into the u8 stream in INT32 and FAST_NARROW, the stored u8 mid with a derived u2 in
bit planes, and MobileNet-V2's features_3_conv_2 (C=144 -> 24, b64) with an s8 residual.
Offline: `run_module_report` compiles them in a fresh Python without TRITON_INTERPRET.
"""

from __future__ import annotations

import json

import pytest

from triton_offline import module_report_or_skip, one_launch_rows

#: register / spill checks (ptxas, several seconds each): the slow tier
pytestmark = pytest.mark.slow

#: name: (N, H, C, K, residual, kinds, int32, (mid, relu))
CASES = {
    "r50_u8res_u8_int32": (8, 56, 64, 256, "u8", ("mid",), True, ("u8", True)),
    "r50_u8res_u8_fast": (8, 56, 64, 256, "u8", ("mid",), False, ("u8", True)),
    "r50_u8res_mid_u2": (8, 56, 64, 256, "u8", ("mid", "u2"), False, ("u8", True)),
    "mbv2_features_3_conv_2": (64, 56, 144, 24, "s8", ("mid",), False, ("s8", False)),
}


def block_end_launchers(template: str, cases: dict) -> dict:
    """name -> Launcher of `template`'s default config and fused-outputs tile for each of
    `cases` (CASES' tuples), bound on CPU tensors (device checks off; nothing launched)."""
    import torch

    from lowbit.core import ConvWorkload, Epilogue, Layout, Precision
    from lowbit.core.validate import operand_shapes
    from lowbit.kernels import get_template, load_backends
    from lowbit.kernels.base import acc_bound
    from lowbit.kernels.triton import netops as K
    from lowbit.kernels.triton import stored, templates
    from lowbit.kernels.triton.conv_outputs import bind_conv_outputs
    from lowbit.reference import random_inputs
    from test_triton_netops_block_end import LAYOUT_OF, block_end_specs

    templates.interpreting = stored.interpreting = lambda: True
    load_backends()
    conv = get_template(template)
    out = {}
    for name, (n, h, c, k, res, kinds, int32, (mid, relu)) in cases.items():
        wl = ConvWorkload(N=n, H=h, W=h, C=c, K=k, R=1, S=1, a="u8", epilogue=Epilogue())
        xs, ws, shape = (tuple(s) for s in operand_shapes(wl))
        params = random_inputs(wl.replace(N=1, H=1, W=1), seed=1, device="cpu")[2]
        p = Precision.parse(res)
        specs = block_end_specs(k, acc_bound(wl), max(-p.qmin, p.qmax), int32, mid, relu,
                                kinds, 3)
        outs = [K.empty_packed(shape, sp.precision, LAYOUT_OF[kd], "cpu")
                for sp, kd in zip(specs, kinds, strict=True)]
        out[name] = bind_conv_outputs(
            conv.build(wl, conv.default_config(wl)),
            torch.zeros(xs, dtype=torch.uint8), torch.zeros(ws, dtype=torch.int8), params,
            specs, outs, K.empty_packed(shape, p, Layout.INT8, "cpu"))
    return out


@pytest.fixture(scope="module")
def report() -> dict:
    return module_report_or_skip(__file__)


def test_fused_outputs_compile_without_spill_or_float64_conversion(report):
    rows = one_launch_rows(report, CASES, "pointwise_outputs_kernel")
    assert all(r["cvt_f64"] == 0 for r in rows.values()), rows
    # three programs of 128 threads fit a SM's 64 K registers (`pointwise_outputs`)
    assert all(r["regs"] <= 168 for r in rows.values()), rows


if __name__ == "__main__":
    from triton_offline import launcher_report

    print(json.dumps(launcher_report(block_end_launchers("triton.conv2d_pointwise", CASES))))
