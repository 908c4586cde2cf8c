"""The float64 requantization without conversion instructions (`kernels/triton/epilogue.py`):
`int32_to_float64` equals torch's conversion and `nearest_int32` of the half-step form
(a + 1/2) 2^-s equals floor((a + 2^(s-1)) / 2^s) on the edges of their ranges and on random
values (interpreter), and `float64_requant` refuses multipliers whose sums or results could
leave what that form takes."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from lowbit.core.epilogue import EpilogueParams
from lowbit.kernels.triton.epilogue import (
    FLOOR_INT32_LIMIT,
    HALF_STEP_EXACT,
    float64_requant,
    half_step_bias,
    int32_to_float64,
    nearest_int32,
)


@triton.jit
def _convert_kernel(y_ptr, v_ptr, as_float_ptr, floor_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask, other=0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    tl.store(as_float_ptr + offs, int32_to_float64(y), mask=mask)
    tl.store(floor_ptr + offs, nearest_int32(v), mask=mask)


def _run(y: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = y.numel()
    as_float = torch.full((n,), 7.25, dtype=torch.float64, device=y.device)
    floors = torch.full((n,), 12345, dtype=torch.int32, device=y.device)
    _convert_kernel[(triton.cdiv(n, 64),)](y, v, as_float, floors, n, BLOCK=64)
    return as_float.cpu(), floors.cpu()


def test_int32_to_float64_and_the_half_step_rounding_on_edges_and_random_values():
    _check_on("cpu")


@pytest.mark.gpu
def test_gpu_int32_to_float64_and_the_half_step_rounding():
    """The same on the GPU: the compiled PTX (no conversion instruction) equals torch."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    _check_on("cuda")


def _check_on(device: str) -> None:
    g = torch.Generator().manual_seed(7)
    edges = [-2**31, -2**31 + 1, -65536, -1, 0, 1, 255, 2**24 + 1, 2**31 - 2, 2**31 - 1]
    y = torch.cat([torch.tensor(edges, dtype=torch.int32),
                   torch.randint(-2**31, 2**31, (310,), generator=g, dtype=torch.int32)])
    # sums a (integers) and shifts s: the kernels' v = (a + 1/2) 2^-s, the floor's
    # (a + 2^(s-1)) >> s; a at and beside the rounding steps and the range's ends
    s = torch.randint(1, 22, (320,), generator=g, dtype=torch.int64)
    steps = torch.randint(-2**29, 2**29, (320,), generator=g, dtype=torch.int64)
    offset = torch.randint(-2, 3, (320,), generator=g, dtype=torch.int64)
    a = (steps << s) - (1 << (s - 1)) + offset  # around the step between steps - 1, steps
    a[:8] = torch.tensor([0, -1, 1, 2**50, -2**50, 2**51 - 1, -(2**51) + 1, 2**40 + 7])
    s[:8] = torch.tensor([1, 1, 1, 21, 21, 22, 22, 30])
    v = half_step_bias(a, torch.pow(2.0, -s.to(torch.float64)))
    want = (a + (1 << (s - 1))) >> s
    assert bool((want.abs() < FLOOR_INT32_LIMIT).all()) and bool(
        (a.abs() + (1 << (s - 1)) < HALF_STEP_EXACT).all())
    as_float, rounded = _run(y.to(device), v.to(device))
    assert torch.equal(as_float, y.to(torch.float64))
    assert torch.equal(rounded, want.to(torch.int32))
    assert y.numel() == v.numel() == 320


def test_float64_requant_keeps_the_floors_in_int32():
    """The float64 form is refused (None: the int64 form runs) where acc m 2^-s may reach
    FLOOR_INT32_LIMIT, and taken just below it."""
    k = 4
    shift = torch.full((k,), 20, dtype=torch.int64)
    zeros = torch.zeros(k, dtype=torch.int64)

    def params(mult: int) -> EpilogueParams:
        return EpilogueParams(multiplier=torch.full((k,), mult, dtype=torch.int64),
                              shift=shift, shifted_bias=zeros)

    acc_top = 2**20
    fits = (FLOOR_INT32_LIMIT - 1) * 2**20 // acc_top - 1  # (acc_top m + 2^19) >> 20 < limit
    assert float64_requant(acc_top, params(fits), "cpu") is not None
    assert float64_requant(acc_top, params(fits + 2), "cpu") is None
