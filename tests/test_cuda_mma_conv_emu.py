"""The mma.sync conv kernel's own CUDA text run through the host emulation (`mma_conv_emu`):
bit-exact against the reference on the CPU, for the techniques and the odd cases."""

from __future__ import annotations

import pytest

from lowbit.core import ConvWorkload, Epilogue
from lowbit.kernels.cuda.host_emu import compiler
from lowbit.kernels.cuda.mma_conv import S4_TEMPLATE, S8_TEMPLATE, MmaConvKernel
from lowbit.kernels.cuda.mma_conv_emu import emulate
from lowbit.reference import random_inputs, run

pytestmark = pytest.mark.skipif(compiler() is None, reason="needs a host C++ compiler")

U2_PACKED = Epilogue(bias=True, relu=True, out="u2", out_layout="packed")
CASES = [
    # s8, odd C (byte loads), stride 2, int32 out, default config
    (S8_TEMPLATE, dict(C=5, K=13, stride=2, a="u8"), Epilogue(), {}),
    # s8, 16-byte cp.async, duplicate-aware halo + register packing of u2 outputs
    (S8_TEMPLATE, dict(C=32, K=21), U2_PACKED,
     dict(loop_order="crs", duplicate_aware_load=True, register_packing=True)),
    # s8, packed output through the shared-memory pass, channel-outer order
    (S8_TEMPLATE, dict(C=32, K=20, w="s8", a="s8"),
     Epilogue(bias=True, out="s4", out_layout="packed"), dict(loop_order="crs")),
    # s4 m16n8k64, odd C: the padding nibble is masked
    (S4_TEMPLATE, dict(C=13, K=11, w="s4", a="u4", w_layout="packed", a_layout="packed"),
     Epilogue(bias=True, relu=True, out="s8"), dict(register_packing=True)),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_emulated_kernel_is_bit_exact(case: int) -> None:
    template, shape, epi, knobs = CASES[case]
    wl = ConvWorkload(**{**dict(N=1, H=7, W=6, R=3, S=3, pad=1, w="s8", a="s8"), **shape},
                      epilogue=epi)
    cfg = template.default_config(wl).replace(**knobs)
    assert template.space(wl).why_invalid(cfg) is None
    x, w, params = random_inputs(wl, seed=case)
    out = emulate(MmaConvKernel(template, wl, cfg), x, w, params)
    ref = run(wl, x, w, params)
    assert (out == ref).all(), f"{int((out != ref).sum())} outputs differ"
