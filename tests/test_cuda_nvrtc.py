"""NVRTC backend: compile (no GPU needed), disk cache, compile errors, argument packing; launch
on a GPU when one is present."""

from __future__ import annotations

import ctypes

import pytest
import torch

from lowbit.kernels.cuda import nvrtc

ADD_ONE = r"""
extern "C" __global__ void add_scaled(const int* x, int* y, int n, int k, float f) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + k + (int)f;
}
"""

BMMA = r"""
extern "C" __global__ void bmma(const unsigned* a, int* d) {
  int c[4] = {0, 0, 0, 0};
  unsigned x = a[threadIdx.x];
  asm("mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc {%0,%1,%2,%3}, "
      "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(x), "r"(x), "r"(x), "r"(x), "r"(x), "r"(x));
  d[threadIdx.x] = c[0] + c[1] + c[2] + c[3];
}
"""


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWBIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(nvrtc, "_memory_cache", {})
    return tmp_path / "nvrtc"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_compile_cubin_and_ptx(cache, arch):
    cubin = nvrtc.compile_cubin(BMMA, arch)
    assert cubin[:4] == b"\x7fELF"
    ptx = nvrtc.compile_ptx(BMMA, arch)
    assert b".target " + arch.encode() in ptx
    assert b"and.popc" in ptx


def test_compile_leaves_interpreter_bytes_intact(cache):
    """NVRTC fills caller buffers: a one-byte log (empty, just NUL) once went into the shared
    b" " object and broke every later b" " (torch.save wrote unloadable files)."""
    nvrtc.compile_cubin(ADD_ONE, "sm_80")
    nvrtc.compile_ptx(ADD_ONE, "sm_80")
    assert b" " * 1 == bytes([32]) and b" ".join([b"a", b"b"]) == b"a b"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_ptxas_report_names_registers_and_spills(arch):
    """ptxas -v figures of one kernel of the source, without a GPU."""
    small = nvrtc.ptxas_report(ADD_ONE, arch, "add_scaled")
    assert 4 <= small["registers"] <= 32 and small["spill_bytes"] == 0
    assert nvrtc.ptxas_report(BMMA + ADD_ONE, arch, "bmma")["registers"] >= 6
    with pytest.raises(nvrtc.CompileError, match="NVRTC compilation"):
        nvrtc.ptxas_report("this is not CUDA", arch, "none")


WGMMA_B1 = r"""
extern "C" __global__ void wgmma_b1(int* out, unsigned long long da, unsigned long long db) {
  int d[4] = {0, 0, 0, 0};
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k256.s32.b1.b1.and.popc {%0,%1,%2,%3}, %4, %5, p;\n}\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]) : "l"(da), "l"(db), "r"(1));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  out[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}
"""


def test_wgmma_b1_compiles_for_sm90a_only(cache):
    """The Hopper warpgroup b1 AND MMA assembles for sm_90a and is rejected for sm_80."""
    assert nvrtc.compile_cubin(WGMMA_B1, "sm_90a")[:4] == b"\x7fELF"
    assert b"wgmma.mma_async" in nvrtc.compile_ptx(WGMMA_B1, "sm_90a")
    with pytest.raises(nvrtc.CompileError):
        nvrtc.compile_cubin(WGMMA_B1, "sm_80")


def test_disk_cache_keyed_by_source_arch_and_version(cache, monkeypatch):
    first = nvrtc.compile_cubin(ADD_ONE, "sm_80")
    files = sorted(cache.glob("*.cubin"))
    assert len(files) == 1 and files[0].read_bytes() == first
    # a second process (empty memory cache) reads the file instead of compiling
    monkeypatch.setattr(nvrtc, "_memory_cache", {})
    monkeypatch.setattr(nvrtc, "_nvrtc_compile", lambda *a: pytest.fail("recompiled"))
    assert nvrtc.compile_cubin(ADD_ONE, "sm_80") == first
    # another NVRTC version must not read that file
    monkeypatch.setattr(nvrtc, "_memory_cache", {})
    monkeypatch.setattr(nvrtc, "nvrtc_version", lambda: (99, 0))
    monkeypatch.setattr(nvrtc, "_nvrtc_compile", lambda *a: b"fresh")
    assert nvrtc.compile_cubin(ADD_ONE, "sm_80") == b"fresh"
    assert len(list(cache.glob("*.cubin"))) == 2


def test_cache_key_differs_by_arch_options_and_source():
    keys = {nvrtc._cache_key("cubin", ADD_ONE, "80", ()),
            nvrtc._cache_key("cubin", ADD_ONE, "90a", ()),
            nvrtc._cache_key("cubin", ADD_ONE, "80", ("-lineinfo",)),
            nvrtc._cache_key("cubin", ADD_ONE + " ", "80", ()),
            nvrtc._cache_key("ptx", ADD_ONE, "80", ())}
    assert len(keys) == 5


def test_compile_error_carries_log(cache):
    with pytest.raises(nvrtc.CompileError) as info:
        nvrtc.compile_cubin("extern \"C\" __global__ void k() { undefined_thing(); }", "sm_80")
    assert "undefined_thing" in info.value.log
    assert "undefined_thing" in str(info.value)
    assert not list(cache.glob("*.cubin"))


def test_bad_arch_is_a_value_error():
    with pytest.raises(ValueError, match="arch"):
        nvrtc.compile_cubin(ADD_ONE, "hopper")


def test_argument_packing():
    t = torch.arange(4, dtype=torch.int32)
    array, keep = nvrtc.pack_args([t, 7, 2.5, None, ctypes.c_int64(-3), True])
    values = [ctypes.cast(array[i], ctypes.POINTER(type(keep[i]))).contents.value
              for i in range(len(keep))]
    assert values == [t.data_ptr(), 7, 2.5, 0, -3, 1]
    assert [type(v) for v in keep] == [ctypes.c_uint64, ctypes.c_int, ctypes.c_float,
                                       ctypes.c_uint64, ctypes.c_int64, ctypes.c_int]
    with pytest.raises(ValueError, match="C int"):
        nvrtc.pack_args([2**31])
    with pytest.raises(TypeError, match="not supported"):
        nvrtc.pack_args(["x"])


def test_argument_packing_passes_raw_bytes_by_value():
    """A by-value struct parameter (a 128-byte tensor map) is passed as its bytes' address."""
    raw = (ctypes.c_ubyte * 128).from_buffer_copy(bytes(range(128)))
    array, keep = nvrtc.pack_args([raw, 5])
    assert keep[0] is raw
    assert ctypes.string_at(array[0], 128) == bytes(range(128))
    assert ctypes.cast(array[1], ctypes.POINTER(ctypes.c_int)).contents.value == 5


def test_dim3():
    assert nvrtc._dim3(5, "grid") == (5, 1, 1)
    assert nvrtc._dim3((2, 3), "grid") == (2, 3, 1)
    with pytest.raises(ValueError, match="block"):
        nvrtc._dim3((0,), "block")


@pytest.mark.gpu
def test_launch_on_current_stream():
    kernel = nvrtc.load_kernel(ADD_ONE, "add_scaled")
    n = 1000
    x = torch.randint(-100, 100, (n,), dtype=torch.int32, device="cuda")
    y = torch.full_like(x, -12345)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        kernel.launch((n + 127) // 128, 128, [x, y, n, 5, 2.0])
    stream.synchronize()
    assert torch.equal(y, x + 7)


@pytest.mark.gpu
def test_launch_bmma_and_big_shared_memory():
    kernel = nvrtc.load_kernel(BMMA, "bmma")
    a = torch.full((32,), -1, dtype=torch.int32, device="cuda")
    d = torch.zeros(32, dtype=torch.int32, device="cuda")
    kernel.launch(1, 32, [a, d], shared_mem=64 * 1024)  # raises the dynamic smem limit first
    torch.cuda.synchronize()
    assert torch.equal(d, torch.full_like(d, 4 * 256))  # all-ones rows: popc 256 per element
