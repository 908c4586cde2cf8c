"""What lowbit knows of a GPU, in one place: `GpuSpec` (per-SM resources and measured peaks).

The kernel templates shape their spaces and defaults for one design target (`TARGET`, the H100
SXM: split-K only where a grid leaves its SMs idle, shared memory and register budgets); the
performance model reasons about whichever GPU it is asked (`gpu_spec_for`, `current_gpu_spec`).
Peaks are the rates measured on an H100 80GB HBM3 (docs/design.md, "Hardware facts");
`perfmodel.roofline.measure_bandwidth` re-measures the copy bandwidth in a benchmark's own run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GpuSpec:
    """Resources of one GPU (per SM unless named otherwise) and its measured rates: ops/s per
    instruction class, bytes/s of device memory (read + write)."""

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
    b1_and: float = 10_279e12   # mma.sync m16n8k256 b1 .and.popc, bit-ops/s
    int8: float = 1_158e12      # Triton tl.dot int8 (wgmma s8), ops/s
    int8_mma_sync: float = 1_280e12
    int4_mma_sync: float = 47e12  # emulated on Hopper
    fp16: float = 708e12        # dense half-precision matmul (bf16 8192^3 measured)
    bandwidth: float = 3.0e12   # device-to-device copy, bytes read + written per second

    def peaks(self) -> dict[str, float]:
        """The measured rates alone (what a results file records beside its figures)."""
        return {f: getattr(self, f) for f in PEAK_FIELDS}

    def rate(self, instruction: str) -> float:
        """The peak of an instruction class ("int8", "b1_and", "fp16", "int8_mma_sync",
        "int4_mma_sync"; any other: int8's)."""
        return {"int8": self.int8, "b1_and": self.b1_and, "fp16": self.fp16,
                "int8_mma_sync": self.int8_mma_sync,
                "int4_mma_sync": self.int4_mma_sync}.get(instruction, self.int8)


#: the measured rates of a GpuSpec (`GpuSpec.peaks`)
PEAK_FIELDS = ("b1_and", "int8", "int8_mma_sync", "int4_mma_sync", "fp16", "bandwidth")
H100 = GpuSpec(name="NVIDIA H100 80GB HBM3", sms=132)
# H200: the H100 SXM's SMs and clocks, faster HBM3e (4.3 TB/s copy measured on our H200s)
H200 = replace(H100, name="NVIDIA H200", bandwidth=4.3e12)
#: the GPU the kernel templates' spaces and defaults are shaped for (module doc)
TARGET = H100


def gpu_spec_for(name: str | None) -> GpuSpec:
    """The spec of a GPU by name: the H200 or H100 (also for unknown names: the design
    target's figures under that name); None: the current GPU (`current_gpu_spec`)."""
    if name is None:
        return current_gpu_spec()
    if "H200" in name.upper():
        return H200
    return H100 if "H100" in name.upper() else GpuSpec(name=name, sms=H100.sms)


def current_gpu_spec() -> GpuSpec:
    """The spec of cuda:0 when a GPU is present (its name's figures, with the SM count, shared
    memory, registers and threads the driver reports), else the H100 spec the design
    targets."""
    try:
        import torch

        if not torch.cuda.is_available():
            return H100
        p = torch.cuda.get_device_properties(0)
        smem_sm = getattr(p, "shared_memory_per_multiprocessor", H100.smem_per_sm)
        smem_blk = getattr(p, "shared_memory_per_block_optin", H100.smem_per_block)
        regs = getattr(p, "regs_per_multiprocessor", H100.regs_per_sm)
        threads = getattr(p, "max_threads_per_multi_processor", H100.max_threads_per_sm)
        return replace(gpu_spec_for(p.name), name=p.name, sms=p.multi_processor_count,
                       regs_per_sm=regs, smem_per_sm=smem_sm, smem_per_block=smem_blk,
                       max_threads_per_sm=threads)
    except Exception:  # no driver / odd build: fall back to the design target
        return H100


__all__ = ["H100", "H200", "PEAK_FIELDS", "TARGET", "GpuSpec", "current_gpu_spec", "gpu_spec_for"]
