"""The kernels the benchmark probes build through the templates' hooks still compile: every
family's default rendered with each named cut point it has (`bitserial_render.CUTS`,
benchmarks/probes/cut_probe.py) compiles for sm_90a, and the cut text stays out of the kernels
that are not cut."""

from __future__ import annotations

import pytest

from lowbit.core import Epilogue, Layout, Precision
from lowbit.kernels.cuda import FAMILIES
from lowbit.kernels.cuda.bitserial_render import CUTS
from lowbit.kernels.cuda.cu_source import cu_file
from lowbit.kernels.cuda.nvrtc import compile_ptx
from test_cuda_bitserial import conv

BP = Layout.BITPLANE


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_family_has_every_cut_point(family):
    """Each family's entry file marks the MMAs, the epilogue and the stage loads."""
    entry = cu_file(family.entry)
    for cut in CUTS:
        assert f"CUT_{cut.upper()} " in entry, (family.entry, cut)


@pytest.mark.parametrize("cut", sorted(CUTS))
def test_cut_kernels_compile(cut):
    """The APNN-TC-like conv's default of every family, with the cut, compiles (PTX for sm_90a:
    the cut part's code stays behind its never-taken branch)."""
    wl = conv(Precision(1, "binary"), Precision(2),
              Epilogue(bias=True, relu=True, out=Precision(2), out_layout=BP),
              N=2, H=16, W=16, C=128, K=128)
    compiled = 0
    for family in FAMILIES:
        assert family.supports(wl)
        cfg = family.default_config(wl, "sm_90a")
        text = family.render(wl, cfg, cuts=(cut,))
        assert f"#define LOWBIT_CUT_{cut.upper()} 1" in text
        ptx = compile_ptx(text, "sm_90a").decode()
        assert f".entry {family.kernel_name(cfg)}" in ptx
        compiled += 1
    assert compiled == len(FAMILIES)
