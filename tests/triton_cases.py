"""Shared cases and checks of the Triton kernel tests (test_triton_*.py)."""

from __future__ import annotations

import torch

from lowbit.core import Epilogue
from lowbit.core.validate import out_storage
from lowbit.reference import random_inputs, run

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"

#: every output kind and layout of the fused epilogue
EPILOGUES = [
    Epilogue(),
    Epilogue(bias=True, relu=True, out="s8"),
    Epilogue(relu=True, out="u8"),
    Epilogue(bias=True, out="fp16"),
    Epilogue(bias=True, relu=True, out="u4", out_layout="packed"),
    Epilogue(out="s2", out_layout="packed"),
    Epilogue(relu=True, out="u1", out_layout="packed"),
    Epilogue(bias=True, out="s3", out_layout="bitplane"),
    Epilogue(relu=True, out="u2", out_layout="bitplane"),
]


def poisoned(wl, device=DEVICE) -> torch.Tensor:
    """An output buffer filled with values no kernel writes (NaN / 0x5A / -12345)."""
    shape, dtype = out_storage(wl)
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, 0x5A if dtype.itemsize == 1 else -12345, dtype=dtype,
                      device=device)


def check(wl, kernel, seed: int, device=DEVICE) -> None:
    """kernel(x, w, params) on fresh random inputs equals `lowbit.reference.run` bit for bit."""
    x, w, params = random_inputs(wl, seed, device=device)
    out = kernel(x, w, params, out=poisoned(wl, device))
    ref = run(wl, x, w, params)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if out.dtype == torch.float16:
        # fp16(float32(y) * scale) in both: the same two roundings, so exact
        assert not torch.isnan(out).any()
    assert torch.equal(out, ref), f"{wl.key} {dict(kernel.config)}: " \
        f"{(out != ref).sum().item()} of {out.numel()} differ"
