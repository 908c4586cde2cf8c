"""The kernels that benchmark scripts build from the library's text (`benchmarks/apconv_probe.py`'s
cut variants) still render and compile: a probe's text edits must find the text they cut, and
an edit of the library's kernels that moves it is caught here rather than on the device."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import apconv_probe
from bitserial import bitserial_workload, workloads
from lowbit.core import Config
from lowbit.kernels.cuda import BITSERIAL, bitserial
from lowbit.kernels.cuda.nvrtc import compile_cubin
from shift_probe import variant_render

# variants that need another kernel path than the in-place rows' (HALO=1's gather)
GATHER_ONLY = {"no_gather", "no_halo_wait"}


def _in_place_rows():
    base = dict(workloads(False))["apconv_b1_c1024"]
    for prec, changes in apconv_probe.ROWS:
        wl = bitserial_workload(base, prec)
        cfg = Config(apconv_probe.BEST[prec]).replace(**changes)
        assert BITSERIAL.space(wl, "sm_90a").is_valid(cfg), (prec, changes)
        yield wl, cfg


@pytest.mark.parametrize("variant", sorted(set(apconv_probe.VARIANTS) - GATHER_ONLY))
def test_apconv_probe_cuts_apply(variant):
    """Every cut of the probe finds its text, once, in the in-place rows' kernels."""
    render = variant_render(apconv_probe.VARIANTS[variant]["wgmma"])
    for wl, cfg in _in_place_rows():
        text = render(wl, cfg)
        assert "bitserial_wgmma(" in text


@pytest.mark.parametrize("variant", ["rows_first", "no_prefetch", "no_mma_no_epilogue"])
def test_apconv_probe_variants_compile(variant, tmp_path, monkeypatch):
    """The cut variants that move or drop code compile for sm_90a (NVRTC, no GPU)."""
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    render = variant_render(apconv_probe.VARIANTS[variant]["wgmma"])
    wl, cfg = next(_in_place_rows())
    assert compile_cubin(render(wl, cfg), "sm_90a")[:4] == b"\x7fELF"
    assert bitserial.kernel_name(cfg) == "bitserial_wgmma"


def test_apconv_floor_kernels_compile(tmp_path, monkeypatch):
    """`benchmarks/apconv_floor.py` includes the library's device primitives: each copy
    mechanism's kernel compiles for sm_90a (it once stopped compiling after a library change)."""
    import apconv_floor

    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    for mode in apconv_floor.MODES:
        source = apconv_floor.floor_source(mode, 64, 2)
        assert compile_cubin(source, "sm_90a")[:4] == b"\x7fELF", mode
