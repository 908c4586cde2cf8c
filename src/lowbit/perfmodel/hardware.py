"""Per-SM resource limits of the GPU the model reasons about."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """Resources of one GPU (per SM unless named otherwise)."""

    name: str
    sms: int
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    smem_per_sm: int = 228 * 1024  # bytes; Hopper: 228 KB per SM
    smem_per_block: int = 227 * 1024  # bytes a single block may opt into
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    warp_size: int = 32
    reg_alloc_unit: int = 256  # registers are allocated per warp in chunks of 256


H100 = GpuSpec(name="NVIDIA H100 80GB HBM3", sms=132)
H200 = GpuSpec(name="NVIDIA H200", sms=132)  # same SMs as the H100 SXM, faster HBM3e


def gpu_spec_for(name: str | None) -> GpuSpec:
    """The spec of a GPU by name: the H200 or H100 (also for unknown names: the design
    target); None: the current GPU (`current_gpu_spec`)."""
    if name is None:
        return current_gpu_spec()
    if "H200" in name.upper():
        return H200
    return H100 if "H100" in name.upper() else GpuSpec(name=name, sms=H100.sms)


def current_gpu_spec() -> GpuSpec:
    """The spec of cuda:0 when a GPU is present (SM count and shared memory from the
    driver), else the H100 spec the design targets."""
    try:
        import torch

        if not torch.cuda.is_available():
            return H100
        p = torch.cuda.get_device_properties(0)
        smem_sm = getattr(p, "shared_memory_per_multiprocessor", H100.smem_per_sm)
        smem_blk = getattr(p, "shared_memory_per_block_optin", H100.smem_per_block)
        regs = getattr(p, "regs_per_multiprocessor", H100.regs_per_sm)
        threads = getattr(p, "max_threads_per_multi_processor", H100.max_threads_per_sm)
        return GpuSpec(name=p.name, sms=p.multi_processor_count, regs_per_sm=regs,
                       smem_per_sm=smem_sm, smem_per_block=smem_blk, max_threads_per_sm=threads)
    except Exception:  # no driver / odd build: fall back to the design target
        return H100
