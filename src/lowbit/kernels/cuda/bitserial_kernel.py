"""A compiled bit-serial kernel and its launcher: `kernel(x, w, params)`, or `bind(...)` once
and launch many times (CUDA-graph capture, timing, chained layers)."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

import torch

from ...core import Config, Workload
from ...core.epilogue import EpilogueParams, check_shifted_bias
from ...core.validate import check_inputs, output_buffer
from .bitserial_layout import (
    k_tiles,
    persistent_grid,
    smem_bytes,
    stage_bytes,
    threads,
    tile_grid,
)
from .bitserial_shape import WTAP_THREADS, XPOP_THREADS, conv_shape, side_table_blocks
from .bitserial_tables import (
    block_end_args,
    epilogue_thresholds,
    epilogue_vectors,
    halo_tensor_map,
    row_table,
    side_tables,
    split_workspace,
    weight_images,
)
from .nvrtc import CudaKernel, compile_cubin, device_arch

#: BitserialKernel.bind(chained=True, trigger=...): when the next kernel may launch -> the
#: CHAINED value the kernels are rendered with (bitserial_chain.cu, chain_begin)
CHAIN_TRIGGERS = {"start": 1, "after_mma": 2}


class KernelSource(Protocol):
    """What a kernel needs of its template: a bit-serial family or cuda.int8_wgmma."""

    name: str

    def spec(self, config: Mapping) -> Config: ...

    def kernel_name(self, config: Mapping) -> str: ...

    def render(self, workload: Workload, config: Mapping, chained: int = 0,
               cuts: Collection[str] = ()) -> str: ...


def chain_trigger(blocks: int, per_sm: int, sms: int, persistent: bool) -> str:
    """The trigger bind(chained=True, trigger="auto") takes for a grid of `blocks` blocks, of
    which `per_sm` fit an SM at once: "after_mma" for one wave of blocks that share SMs (a
    trigger at the start lets later layers' blocks fill the SMs' free slots and wait there,
    so the next layer's blocks double up: the APNN-TC conv's 32-wide blocks ran 11.1 us per
    layer against 6.1), else "start" (the next layer's blocks take the SMs this grid leaves
    free, or the last wave's start is late anyway). 24 of 27 configs measured on an H100 took
    the faster trigger by this rule, the other 3 lost <= 0.6 us (NOTES.md, "Chained launches")."""
    if persistent or per_sm < 2 or blocks > per_sm * sms:
        return "start"
    return "after_mma"


class BitserialKernel:
    """Compiled bit-serial kernel for one (workload, config) of `family`; call as
    kernel(x, w, params). `config` is the family's config (what records store); `spec` its
    full parameters. `cuts`: probes only (`bitserial_render.CUTS`; the output is garbage)."""

    def __init__(self, family: KernelSource, workload: Workload, config: Config,
                 arch: str | None = None, cuts: Collection[str] = ()) -> None:
        self.family = family
        self.template = family.name
        self.workload = workload
        self.config = config
        self.spec = family.spec(config)
        self.cuts = tuple(cuts)
        self.source = family.render(workload, config, cuts=self.cuts)
        self.arch = arch or device_arch()
        cubin = compile_cubin(self.source, self.arch)
        self._persistent = bool(self.spec["PERSIST"])
        self._name = family.kernel_name(config)
        self._main = CudaKernel(cubin, self._name)
        self._wtap = CudaKernel(cubin, "bitserial_wtap")
        self._xpop = CudaKernel(cubin, "bitserial_xpop")
        self._wimage = CudaKernel(cubin, "bitserial_wimage") if self.spec["BULK_WEIGHTS"] else None
        self._chained: dict[int, tuple[CudaKernel, CudaKernel]] = {}  # (main, xpop) by mode
        self._grid = tile_grid(workload, self.spec)
        self._threads = threads(self.spec)
        self._smem = smem_bytes(workload, self.spec)

    def chained_kernels(self, trigger: str = "start") -> tuple[CudaKernel, CudaKernel]:
        """The (main, xpop) kernels rendered for programmatic dependent launch with the next
        kernel's launch at `trigger` (`CHAIN_TRIGGERS`; compiled on first use)."""
        mode = CHAIN_TRIGGERS[trigger]
        if mode not in self._chained:
            source = self.family.render(self.workload, self.config, chained=mode,
                                        cuts=self.cuts)
            cubin = compile_cubin(source, self.arch)
            self._chained[mode] = (CudaKernel(cubin, self._name),
                                   CudaKernel(cubin, "bitserial_xpop"))
        return self._chained[mode]

    def __call__(self, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """Validate, then launch; `out` (optional) is a preallocated contiguous output buffer."""
        return self.bind(x, w, params, out)()

    def bind(self, x: torch.Tensor, w: torch.Tensor, params: EpilogueParams,
             out: torch.Tensor | None = None, chained: bool = False,
             trigger: str = "auto") -> Callable[[], torch.Tensor]:
        """Validate once and return a no-argument launcher (CUDA-graph capture, timing):
        `check_inputs` reads the epilogue vectors, which syncs the device.

        chained=True (sm_90+; a network's layers, each reading the previous one's output): the
        launcher's kernels go out as programmatic dependents of the previous kernel on the
        stream (PDL), so their blocks start on the SMs that kernel leaves free, issue what
        depends on the layer's constants alone (with BULK_WEIGHTS the weights' copies, the
        epilogue's prefetches), then wait for it to finish before reading `x` or writing `out`.
        Same results; what it saves is the launch gap and the weights' arrival, per layer.
        `trigger` says when the next kernel may launch: "start" (at once), "after_mma" (once
        a one-tile block has issued its last MMAs: where several blocks fit an SM, later
        layers' waiting blocks then do not crowd this layer's; persistent kernels: at exit),
        or "auto" (`chain_trigger`, from the grid and the blocks that fit an SM).

        What depends on the layer's constants alone is worked out here, once, not per launch:
        the requantization thresholds (from `params`) and, for binary activations, the weight
        sums per tap rectangle (`bitserial_wtap`, from `w` and those thresholds), and with
        BULK_WEIGHTS the weights' stage images (`bitserial_wimage`, passed to the main kernel
        as its `w`). The launcher therefore reads `x` afresh each call but keeps the `w` and
        `params` of bind time: after changing `w` in place, call its `refresh_tables()` (or
        bind again). The launcher's `split_workspace` is the split-K partial-sum tensor it
        writes (None without split-K)."""
        wl, spec = self.workload, self.spec
        check_inputs(wl, x, w, params)
        check_shifted_bias(wl.epilogue, params, conv_shape(wl).kout, x.device)
        if trigger != "auto" and trigger not in CHAIN_TRIGGERS:
            raise ValueError(f"trigger must be 'auto' or one of {sorted(CHAIN_TRIGGERS)}, "
                             f"got {trigger!r}")
        if chained and int(self.arch.removeprefix("sm_").rstrip("a")) < 90:
            raise ValueError(f"chained=True needs sm_90 or newer (programmatic dependent "
                             f"launch), this kernel is built for {self.arch}")
        if x.device.type != "cuda":
            raise ValueError(f"x must be a CUDA tensor for {wl.key}, got device {x.device}")
        out = output_buffer(wl, x.device, out)
        # vector loads of the operands; the epilogue stores and reads column pairs as one access
        derived = [(f"params.derived_out[{j}]", t) for j, t in enumerate(params.derived_out)]
        for name, t in (("x", x), ("w", w), ("out", out), ("params.residual", params.residual),
                        *derived):
            if t is not None and t.data_ptr() % 16:
                raise ValueError(f"{name} must start at a 16-byte aligned address")
        wtap, xpop = side_tables(wl, spec, x.device)
        wtap_blocks, xpop_blocks = side_table_blocks(wl)
        thr = epilogue_thresholds(wl, spec, params)
        split_ws, split_count = split_workspace(wl, spec, x.device)
        vrows = row_table(wl, spec, x.device)
        wimg = weight_images(wl, spec, x.device)
        xmap = halo_tensor_map(wl, spec, x)
        bias, scale, mult, shift, thr_arg = epilogue_vectors(wl, params, thr)
        block_end, block_end_tensors = block_end_args(wl, params)
        args = [x, w if wimg is None else wimg, out, bias, scale, mult, shift, wtap, xpop,
                thr_arg, split_ws, split_count, vrows]
        args += [] if xmap is None else [xmap]
        args += [] if block_end is None else [block_end]
        grid: tuple[int, ...] = (*self._grid, spec["SPLIT_K"])
        if self._persistent:  # one wave of resident blocks, each looping over tiles
            per_sm = self._main.max_active_blocks(self._threads, self._smem, x.device)
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            grid = persistent_grid(wl, spec, per_sm * sms)

        def refresh_tables() -> None:
            if wtap is not None:
                self._wtap.launch(wtap_blocks, WTAP_THREADS, [w, thr, wtap])
            if wimg is not None:
                self._wimage.launch((self._grid[0], k_tiles(wl, spec)), self._threads,
                                    [w, wimg], shared_mem=stage_bytes(wl, spec))

        if wtap is not None or wimg is not None:
            refresh_tables()
            # done before any launch on another stream (CUDA-graph timing captures on a side one)
            torch.cuda.current_stream(x.device).synchronize()

        if chained and trigger == "auto":
            per_sm = self._main.max_active_blocks(self._threads, self._smem, x.device)
            sms = torch.cuda.get_device_properties(x.device).multi_processor_count
            trigger = chain_trigger(math.prod(grid), per_sm, sms, self._persistent)
        main, xpop_kernel = (self.chained_kernels(trigger) if chained
                             else (self._main, self._xpop))

        def launch() -> torch.Tensor:
            if xpop is not None:
                xpop_kernel.launch(xpop_blocks, XPOP_THREADS, [x, xpop], programmatic=chained)
            main.launch(grid, self._threads, args, shared_mem=self._smem, programmatic=chained)
            return out

        launch.tables = (mult, block_end_tensors)  # type: ignore[attr-defined]  # kept alive
        launch.chain_trigger = trigger if chained else None  # type: ignore[attr-defined]
        launch.split_workspace = split_ws  # type: ignore[attr-defined]  # split-K diagnostics
        launch.refresh_tables = refresh_tables  # type: ignore[attr-defined]
        return launch
