"""The stem kernels with derived outputs compile for sm_90 without a GPU (Triton's compiler
accepts what the interpreter runs: the TABLE output kind's lookup, the derived thresholds,
the ring kernel's once-per-program non-finite test): "ring", "bands" and "gemm" at ResNet's
7x7/2 + pool, batch 256, a float32 image with the status flag, outputs u8 (INT8) + a u2 and an
s4 reading of it (bit planes); and MobileNet's 3x3/2 first layer at its default. Spills stay
under the limit the engine's compile test allows the stem (tests/test_engine_gpu_compile.py).
Runs in a fresh Python without TRITON_INTERPRET (tests/triton_offline.py)."""

from __future__ import annotations

import json
import os

import pytest
import triton

from triton_offline import run_module_report

#: register / spill checks (ptxas, several seconds each): the slow tier
pytestmark = pytest.mark.slow

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SPILL_LIMIT = 512
CONFIGS = {  # name -> StemConfig knobs (None: the default config)
    "ring_derived": dict(kernel="ring", block_j=32, band_rows=56),
    "bands_derived": None,
    "gemm_derived": dict(kernel="gemm", block_j=32, whole_k=True, num_stages=3, band_rows=8),
}


def _launchers() -> dict:
    """name -> Launcher, built on CPU tensors (device checks off; nothing launched)."""
    import torch

    from lowbit.core import Layout
    from lowbit.kernels.triton import stem as S
    from lowbit.kernels.triton import stored
    from stem_cases import RESNET, derived_specs, specs_for

    stored.interpreting = lambda: True
    image = torch.empty(256, 3, 224, 224)
    weight = torch.ones(64, 7, 7, 3, dtype=torch.int64)
    specs = derived_specs(64, torch.Generator().manual_seed(0), "u8",
                          (("u2", True), ("s4", True)))
    layouts = (Layout.INT8, Layout.BITPLANE, Layout.BITPLANE)
    out = {}
    for name, knobs in CONFIGS.items():
        outs = [S.empty_packed((256, 56, 56, 64), s.precision, lay, "cpu")
                for s, lay in zip(specs, layouts, strict=True)]
        out[name] = S.bind_stem(image, weight, None, specs, outs, scale=0.02,
                                status=torch.zeros(1, dtype=torch.int32),
                                config=None if knobs is None else S.StemConfig(**knobs),
                                **RESNET)
    # MobileNet-V2's first layer at its default ("gemm", 32 channels a program): 3x3/2, no
    # pool, 32 filters, one u8 output, batch 64
    mobile = specs_for(32, torch.Generator().manual_seed(1), (("u8", True),))
    outs = [S.empty_packed((64, 112, 112, 32), mobile[0].precision, Layout.INT8, "cpu")]
    out["gemm_mobilenet_3x3s2"] = S.bind_stem(
        torch.empty(64, 3, 224, 224), torch.ones(32, 3, 3, 3, dtype=torch.int64), None, mobile,
        outs, scale=0.02, status=torch.zeros(1, dtype=torch.int32), stride=2, pad=1,
        pool_pad=None)
    return out


@pytest.fixture(scope="module")
def report() -> dict:
    if not os.path.isdir(BIN):
        pytest.skip("this Triton has no bundled NVIDIA tools (ptxas)")
    return run_module_report(__file__)


def test_stem_kernels_with_derived_outputs_compile_for_sm90(report):
    failed = {k: v for k, v in report.items() if not isinstance(v, list)}
    assert not failed, failed
    kernels = {r["kernel"] for rows in report.values() for r in rows}
    assert kernels == {"stem_ring_kernel", "stem_input_kernel", "stem_conv_kernel",
                       "stem_gemm_kernel"}
    spills = {k: r for k, rows in report.items() for r in rows if r["spill_bytes"] > (
        0 if r["kernel"] == "stem_input_kernel" else SPILL_LIMIT)}
    assert not spills, spills


if __name__ == "__main__":
    from triton_offline import launcher_report

    print(json.dumps(launcher_report(_launchers())))
